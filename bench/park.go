package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"fiberd.io/fiberd/pkg/api"
	"fiberd.io/fiberd/pkg/endpoint"
)

// Templates of the park rows: the C counter whose fibers write 1 and 16 MiB
// of their own before serving. Python's row uses counter-py.
const (
	tplParkC1  = "counter-c-park-1"
	tplParkC16 = "counter-c-park-16"
)

// parkCase is one row of the park table.
type parkCase struct {
	name, tmpl string
	// parkTarget and resumeTarget are issue 18's p50 targets in ms, on an
	// idle machine; 0 for none.
	parkTarget, resumeTarget float64
}

var parkCases = []parkCase{
	{"C, 1 MiB of its own", tplParkC1, 0, 0},
	{"C, 16 MiB of its own", tplParkC16, 30, 25},
	{"Python http counter", tplWarmPy, 30, 25},
}

// ParkRow is park and resume of one template's fiber through the agent.
type ParkRow struct {
	Case     string `json:"case"`
	Template string `json:"template"`
	Measured bool   `json:"measured"`
	Note     string `json:"note,omitempty"`
	// Clone is clone to first byte of a fiber of the same template.
	Clone Summary `json:"clone"`
	// Park is POST /v1/park until it answers: the image on disk, the fiber
	// ended.
	Park Summary `json:"park"`
	// Resume is the Clone of the parked session until the first HTTP byte
	// of the resumed fiber.
	Resume Summary `json:"resume"`
	// ImageMiB is the first image's size, OwnMiB the fiber's own memory
	// then (the park's answer).
	ImageMiB float64 `json:"imageMiB"`
	OwnMiB   float64 `json:"ownMiB"`
	// Targets are the p50 targets, 0 for none.
	ParkTarget   float64 `json:"parkTargetMs,omitempty"`
	ResumeTarget float64 `json:"resumeTargetMs,omitempty"`
}

// isolatedParkCases are parkCases on an agent that isolates every fiber
// (-isolation fiber, fiberd's default on a standalone host): their
// isolated twins, without targets of their own.
func isolatedParkCases() []parkCase {
	out := make([]parkCase, len(parkCases))
	for i, c := range parkCases {
		out[i] = parkCase{name: c.name + ", isolated (fiber)", tmpl: c.tmpl}
	}
	return out
}

// parkRows measures every one of cases, or says why it cannot.
func (r *agentRig) parkRows(ctx context.Context, k *kit, cases []parkCase, n, cloneN int, p *progress) ([]ParkRow, error) {
	st, err := r.client.Status(ctx)
	if err != nil {
		return nil, err
	}
	var out []ParkRow
	for _, c := range cases {
		row := ParkRow{Case: c.name, Template: c.tmpl, ParkTarget: c.parkTarget, ResumeTarget: c.resumeTarget}
		uid, ok := r.uids[c.tmpl]
		g, _ := grantIn(st, uid)
		switch {
		case !st.Checkpoint.Available:
			row.Note = "CHECKPOINT tier absent: " + st.Checkpoint.Reason
		case !ok:
			row.Note = k.missing[c.tmpl]
		case g.Tier != "CHECKPOINT" && st.Checkpoint.Isolated != "":
			row.Note = "isolated fibers do not park here: " + st.Checkpoint.Isolated
		case g.Tier != "CHECKPOINT":
			row.Note = fmt.Sprintf("the grant is served at %s, not CHECKPOINT", g.Tier)
		}
		if row.Note != "" {
			out = append(out, row)
			continue
		}
		p.Phasef("clone to first byte: %s (%d samples)", c.name, cloneN)
		clones, err := r.latency(ctx, uid, cloneN, p.Counter(cloneN))
		if err != nil {
			return nil, fmt.Errorf("%s: clone: %w", c.name, err)
		}
		row.Clone = Summarize(clones)
		p.Phasef("park and resume: %s (%d cycles)", c.name, n)
		parks, resumes, img, own, err := r.parkCycles(ctx, uid, n, p.Counter(n))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		row.Measured = true
		row.Park, row.Resume = Summarize(parks), Summarize(resumes)
		row.ImageMiB, row.OwnMiB = float64(img)/(1<<20), float64(own)/(1<<20)
		out = append(out, row)
	}
	return out, nil
}

// parkCycles clones a fiber of session "bench-park", then n times parks it
// and resumes it (a Clone of the session, dial, GET, first byte), and
// releases the last one. It returns the samples and the first image's
// sizes.
func (r *agentRig) parkCycles(ctx context.Context, uid string, n int, tick func()) (parks, resumes []float64, img, own int64, err error) {
	const session = "bench-park"
	_, id, err := firstByteSession(ctx, r, uid, session)
	if err != nil {
		return nil, nil, 0, 0, fmt.Errorf("first clone: %w", err)
	}
	defer func() { _ = release(r.client, id) }()
	for i := 0; i < n; i++ {
		t0 := time.Now()
		pr, err := r.client.Park(ctx, id)
		if err != nil {
			return nil, nil, 0, 0, fmt.Errorf("park %d: %w", i, err)
		}
		parks = append(parks, Ms(time.Since(t0)))
		if i == 0 {
			img, own = pr.ImageBytes, pr.OwnBytes
		}
		var d time.Duration
		d, id, err = firstByteSession(ctx, r, uid, session)
		if err != nil {
			return nil, nil, 0, 0, fmt.Errorf("resume %d: %w", i, err)
		}
		resumes = append(resumes, Ms(d))
		tick()
	}
	return parks, resumes, img, own, nil
}

// firstByteSession is a Clone of session, dial, GET and the first byte.
// A Clone of a parked session is a resume; it fails unless it is one, or
// the first create.
func firstByteSession(ctx context.Context, r *agentRig, uid, session string) (time.Duration, string, error) {
	t0 := time.Now()
	resp, err := r.client.Clone(ctx, api.CloneRequest{GrantUID: uid, Session: session})
	if err != nil {
		return 0, "", err
	}
	if resp.Kind == api.KindAttach {
		return 0, resp.FiberID, fmt.Errorf("fiber %s: the session was running (attach), not parked", resp.FiberID)
	}
	network, addr, err := endpoint.Parse(resp.Endpoint)
	if err != nil {
		return 0, resp.FiberID, err
	}
	conn, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		return 0, resp.FiberID, fmt.Errorf("fiber %s: %w", resp.FiberID, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.0\r\nHost: fiber\r\n\r\n"); err != nil {
		return 0, resp.FiberID, err
	}
	var one [1]byte
	if _, err := io.ReadFull(conn, one[:]); err != nil {
		return 0, resp.FiberID, fmt.Errorf("fiber %s: first byte: %w", resp.FiberID, err)
	}
	dur := time.Since(t0)
	_, _ = io.Copy(io.Discard, conn) // the whole answer, so the fiber is idle before its park
	return dur, resp.FiberID, nil
}

// parkMarkdown is the park table.
func parkMarkdown(b *strings.Builder, rows []ParkRow) {
	b.WriteString("#### Park and resume (CHECKPOINT tier, CRIU)\n\n")
	var trows [][]string
	target := func(v, t float64) string {
		if t <= 0 || v != v {
			return num(v)
		}
		mark := "meets"
		if v > t {
			mark = "over"
		}
		return fmt.Sprintf("%s (target %s: %s)", num(v), num(t), mark)
	}
	for _, x := range rows {
		if !x.Measured {
			trows = append(trows, []string{x.Case, notMeasured, "", "", "", "", "", x.Note})
			continue
		}
		trows = append(trows, []string{x.Case, fmt.Sprint(x.Park.N),
			num(x.Clone.P50) + " / " + num(x.Clone.P99),
			target(x.Park.P50, x.ParkTarget) + " / " + num(x.Park.P99),
			target(x.Resume.P50, x.ResumeTarget) + " / " + num(x.Resume.P99),
			num(x.ImageMiB), num(x.OwnMiB), x.Note})
	}
	table(b, []string{"fiber", "cycles", "clone to first byte p50 / p99 ms", "park p50 / p99 ms", "resume to first byte p50 / p99 ms", "image MiB", "its own MiB", "note"}, trows)
	b.WriteString("Park is `POST /v1/park` until it answers (the image written, the fiber ended); resume is the Clone of the parked session until the resumed fiber's first HTTP byte. " +
		"An image holds every page the fiber maps, the pages it still shares with its zygote too, so it is larger than the fiber's own memory (`ownBytes`, private dirty). " +
		"The targets are issue 18's, for an idle machine.\n\n")
}

// grantIn is grant uid of st.
func grantIn(st api.Status, uid string) (api.GrantStatus, bool) {
	for _, g := range st.Grants {
		if g.UID == uid {
			return g, true
		}
	}
	return api.GrantStatus{}, false
}
