package fiberd

import (
	"context"
	"fmt"
	"sync"
	"time"

	"fiberd.io/fiberd/pkg/cgroup"
	"fiberd.io/fiberd/pkg/core"
)

// pressureInterval is how long one pressure reading of a grant's cgroup is
// reused, on the agent's clock: a burst of Clones costs one read of
// memory.pressure per grant per interval.
const pressureInterval = time.Second

// pressureReader reads the pressure of admitted grant uid, whose cgroup is
// cg (nil when the home has no cgroup root or the grant has none yet). ok is
// false when there is nothing to read; the Clone is then not checked. The
// agent's is cgroupPressure; tests replace Agent.readPressure with one that
// reads hand-written files.
type pressureReader func(uid string, cg *cgroup.Grant) (p cgroup.Pressure, ok bool, err error)

// cgroupPressure is the pressureReader of a running agent: the PSI figures
// of the grant's cgroup directory (its zygote and every fiber below it).
// A grant without a cgroup has nothing to read. Files the kernel does not
// offer are not an error (Has* false); an unreadable or malformed one is.
func cgroupPressure(uid string, cg *cgroup.Grant) (cgroup.Pressure, bool, error) {
	if cg == nil {
		return cgroup.Pressure{}, false, nil
	}
	p, err := cg.Dir.Pressure()
	if err != nil {
		return cgroup.Pressure{}, true, fmt.Errorf("grant %q: pressure: %w", uid, err)
	}
	return p, true, nil
}

// pressureCache is the last pressure reading of one admitted grant, kept on
// its slot. mu guards the fields and is never held across the read: the
// first Clone to find the reading old marks a read in flight (reading) and
// makes it; Clones arriving meanwhile wait for that read instead of making
// their own, each within its own deadline.
type pressureCache struct {
	mu      sync.Mutex
	at      time.Time // when the reading was taken; zero before the first
	p       cgroup.Pressure
	err     error
	over    bool          // the reading was above the threshold
	reading chan struct{} // closed when the read in flight ends; nil when none
}

// pressureShed is the memory-pressure check of a Clone of the grant of slot
// s, as v shows it (pressure is always SHED: docs/architecture.md,
// Outcomes). It returns
// a SHED with Config.RetryAfter when the "some avg10" of the grant cgroup's
// memory.pressure is above Config.PressureThreshold, and nil when it is
// not, when the threshold is 0 (off), when the grant is not admitted
// (Reserve will miss it), when the grant has no cgroup, when the kernel
// offers no memory.pressure (logged once per agent) or when the file cannot
// be read (logged when it starts failing): the check never refuses a Clone
// it cannot justify. CPU pressure is read but never sheds: a grant whose
// fibers use their whole CPU share stalls on CPU by design, and another
// fiber costs it time, not memory the kernel must reclaim.
//
// A reading is reused for pressureInterval on the agent's clock. clone
// calls it after the thrash budget and before the session is resolved, so
// like the thrash budget it refuses attaches too. When ctx ends while it
// waits for another Clone's read, it does not shed.
func (a *Agent) pressureShed(ctx context.Context, s *slot, v slotView) *core.Miss {
	limit := a.cfg.PressureThreshold
	if limit == 0 || s == nil || !v.admitted {
		return nil
	}
	c := &s.pressure
	for {
		now := a.cfg.Clock.Now()
		c.mu.Lock()
		fresh := !c.at.IsZero() && now.Sub(c.at) < pressureInterval && !now.Before(c.at)
		if fresh {
			over, p := c.over, c.p
			c.mu.Unlock()
			if !over {
				return nil
			}
			return core.Shed(fmt.Sprintf("grant %q is under memory pressure: some avg10 %.2f%% is above the threshold of %g%%", s.uid, p.Memory, limit),
				a.cfg.Issuer, a.cfg.RetryAfter)
		}
		if wait := c.reading; wait != nil {
			c.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil
			}
		}
		done := make(chan struct{})
		c.reading = done
		c.mu.Unlock()

		p, ok, err := a.readPressure(s.uid, v.cg)
		c.mu.Lock()
		wasErr, wasOver := c.err, c.over
		over := ok && err == nil && p.HasMemory && p.Memory > limit
		c.at, c.p, c.err, c.over, c.reading = now, p, err, over, nil
		close(done)
		c.mu.Unlock()
		a.logPressure(s.uid, wasErr, wasOver, p, ok, err, over)
	}
}

// logPressure logs what changed with a new reading: PSI missing (once per
// agent), a read starting or ceasing to fail, the grant crossing the
// threshold either way.
func (a *Agent) logPressure(uid string, wasErr error, wasOver bool, p cgroup.Pressure, ok bool, err error, over bool) {
	log := a.log.WithValues("grant", uid)
	switch {
	case err != nil && wasErr == nil:
		log.Error(err, "Cannot read the grant's memory pressure; its Clones are not shed for pressure until it can be read")
	case err == nil && wasErr != nil:
		log.Info("Grant's memory pressure readable again")
	}
	if ok && err == nil && !p.HasMemory {
		a.noPSI.Do(func() {
			log.Info("memory.pressure is absent (no PSI for memory); Clones are not shed for memory pressure")
		})
	}
	switch {
	case over && !wasOver:
		log.Info("Grant under memory pressure; shedding its Clones", "someAvg10", p.Memory, "threshold", a.cfg.PressureThreshold)
	case !over && wasOver:
		log.Info("Grant's memory pressure relieved; serving its Clones", "someAvg10", p.Memory, "threshold", a.cfg.PressureThreshold)
	}
}

// pressureGate is the memory-pressure check of a Clone of session on slot
// s: pressureShed's miss, unless a pressure park (parkForPressure) made
// room for the Clone within ctx.
func (a *Agent) pressureGate(ctx context.Context, s *slot, v slotView, session string) *core.Miss {
	m := a.pressureShed(ctx, s, v)
	if m == nil || a.parkForPressure(ctx, s, session) {
		return nil
	}
	return m
}
