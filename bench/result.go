package main

import "time"

// Result is everything one run measured; bench writes it as results.json.
// A section that was not measured says so in its Measured and Note fields
// and keeps its numbers empty.
type Result struct {
	// Command is the command line that produced the result.
	Command string `json:"command"`
	// Started is when the run started, Seconds how long it took.
	Started time.Time `json:"started"`
	Seconds float64   `json:"seconds"`
	Quick   bool      `json:"quick"`

	Machine  Machine  `json:"machine"`
	Settings Settings `json:"settings"`
	// Floor is the machine's own costs, measured before fiberd starts.
	Floor HostFloor `json:"hostFloor"`

	Latency   []LatencyRow    `json:"latency"`
	Burst     []BurstRow      `json:"burst"`
	Loop      []LoopRow       `json:"loop"`
	Density   []DensityRow    `json:"density"`
	Park      []ParkRow       `json:"park"`
	Spares    []SpareRow      `json:"spares,omitempty"`
	APIServer APIServerResult `json:"apiServer"`
	KubeHome  KubeHomeResult  `json:"kubeHome"`
	Node      NodeResult      `json:"node"`
	Plots     []string        `json:"plots,omitempty"`
	Warnings  []string        `json:"warnings,omitempty"`
}

// Machine is what the numbers were measured on, read by the program itself.
type Machine struct {
	NProc       int     `json:"nproc"`
	CPU         string  `json:"cpu"`
	MemTotalMiB int64   `json:"memTotalMiB"`
	Kernel      string  `json:"kernel"`
	GoVersion   string  `json:"goVersion"`
	Python      string  `json:"python,omitempty"`
	CC          string  `json:"cc,omitempty"`
	KubeAPI     string  `json:"kubeAPIServer,omitempty"`
	LoadStart   string  `json:"loadAvgStart"`
	LoadEnd     string  `json:"loadAvgEnd"`
	CgroupsUsed bool    `json:"cgroupsUsed"`
	LoadPerCPU  float64 `json:"loadPerCPUStart"`
}

// Settings are the knobs of the run.
type Settings struct {
	N            int     `json:"n"`
	ColdN        int     `json:"coldN"`
	InitMs       int     `json:"initMs"`
	BurstSize    int     `json:"burstSize"`
	BurstRounds  int     `json:"burstRounds"`
	LoopSeconds  float64 `json:"loopSeconds"`
	Concurrency  []int   `json:"concurrency"`
	DensityN     int     `json:"densityN"`
	HoldMiB      int     `json:"holdMiB"`
	DirtyMiB     int     `json:"dirtyMiB"`
	KubePoll     string  `json:"kubePoll"`
	KubeRounds   int     `json:"kubeRounds"`
	MetricClones int     `json:"metricClones"`
	Endpoint     string  `json:"endpoint"`
	ParkN        int     `json:"parkN"`
}

// LatencyRow is clone-to-first-HTTP-byte of one mode.
type LatencyRow struct {
	Mode     string  `json:"mode"`
	What     string  `json:"what"`
	Measured bool    `json:"measured"`
	Note     string  `json:"note,omitempty"`
	Summary  Summary `json:"summary"`
	// Ratio is this mode's p50, p90 and p99 over warm C's.
	RatioP50 float64 `json:"ratioP50"`
	RatioP90 float64 `json:"ratioP90"`
	RatioP99 float64 `json:"ratioP99"`
	// SamplesMs are the raw samples, for the plots.
	SamplesMs []float64 `json:"samplesMs,omitempty"`
	// IsolationCost, on the isolated rows, summarises the differences
	// between each isolated sample and one of the same template without
	// isolation taken next to it (see measureIsolated).
	IsolationCost *Summary `json:"isolationCostMs,omitempty"`
}

// BurstRow is a burst of Size concurrent clones of one mode.
type BurstRow struct {
	Mode     string `json:"mode"`
	Measured bool   `json:"measured"`
	Note     string `json:"note,omitempty"`
	Size     int    `json:"size"`
	Rounds   int    `json:"rounds"`
	// AllServed is, per round, until every fiber of the burst sent its
	// first byte.
	AllServed Summary `json:"allServed"`
	// PerFiber is each fiber's own clone-to-first-byte, over all rounds.
	PerFiber Summary `json:"perFiber"`
	Errors   int     `json:"errors"`
}

// LoopRow is the closed loop of one mode at one concurrency.
type LoopRow struct {
	Mode        string  `json:"mode"`
	Measured    bool    `json:"measured"`
	Note        string  `json:"note,omitempty"`
	Concurrency int     `json:"concurrency"`
	Clones      int     `json:"clones"`
	Seconds     float64 `json:"seconds"`
	PerSecond   float64 `json:"clonesPerSecond"`
	Errors      int     `json:"errors"`
	// Cycle is one caller's clone + first byte + release.
	Cycle Summary `json:"cycle"`
}

// DensityRow is the memory of N fibers against N independent processes of
// the same template.
type DensityRow struct {
	Template string  `json:"template"`
	Measured bool    `json:"measured"`
	Note     string  `json:"note,omitempty"`
	N        int     `json:"n"`
	WarmMiB  float64 `json:"warmPssMiB"`
	ColdMiB  float64 `json:"coldPssMiB"`
	// WarmProcs counts the processes summed for warm: the fibers and
	// their zygote.
	WarmProcs int     `json:"warmProcs"`
	ColdProcs int     `json:"coldProcs"`
	Ratio     float64 `json:"coldOverWarm"`
}

// APIServerResult is what the API server counted while fiberd cloned with
// the Kubernetes home running against it.
type APIServerResult struct {
	Measured bool   `json:"measured"`
	Note     string `json:"note,omitempty"`
	Poll     string `json:"poll"`
	// Idle is the window with no clone, which gives the home's requests
	// per poll period.
	IdleSeconds     float64            `json:"idleSeconds"`
	IdleDelta       map[string]float64 `json:"idleDelta"`
	PerPollPeriod   float64            `json:"requestsPerPollPeriod"`
	WritesPerPeriod float64            `json:"writesPerPollPeriod"`
	Clones          int                `json:"clones"`
	CloneSeconds    float64            `json:"cloneSeconds"`
	CloneDelta      map[string]float64 `json:"cloneDelta"`
	CloneRequests   float64            `json:"cloneWindowRequests"`
	CloneWrites     float64            `json:"cloneWindowWrites"`
	PollRounds      float64            `json:"cloneWindowPollRounds"`
	PerFiber        float64            `json:"requestsPerFiber"`
	WritesPerFiber  float64            `json:"writesPerFiber"`
}

// KubeHomeResult is the Kubernetes home's own timings, over Rounds fresh
// grant Pods.
type KubeHomeResult struct {
	Measured bool   `json:"measured"`
	Note     string `json:"note,omitempty"`
	Rounds   int    `json:"rounds"`
	Poll     string `json:"poll"`
	// GrantFetch is kubernetes.New with a token file: the first grant
	// fetch from the issuer, written to the grants directory.
	GrantFetch Summary `json:"grantFetch"`
	// IssuerServe is the issuer's own part of it: TokenReview and mint.
	IssuerServe Summary `json:"issuerServe"`
	// ReadinessPatch is PublishReady(true): the one status patch.
	ReadinessPatch Summary `json:"readinessPatch"`
	// StartToReady is from the agent's Run to the Pod condition True as
	// read back from the API server (template warm-up included).
	StartToReady Summary `json:"startToReady"`
	// ScopeLoss is from the Pod's deletion to OnScopeLost firing.
	ScopeLoss Summary `json:"scopeLoss"`
}

// NodeResult is the side-by-side comparison on one real node (kubelet,
// containerd, runc, CNI bridge, scheduler and controller manager of
// hack/node-up.sh): the same C template as a fiberd grant Pod, as a Pod per
// worker and as an agent-sandbox warm pool, measured in one run.
type NodeResult struct {
	Measured bool   `json:"measured"`
	Note     string `json:"note,omitempty"`
	// Versions are the parts the rows ran on, each with where it came
	// from.
	Versions []Version `json:"versions,omitempty"`
	// BurstSize is how many workers each row's burst starts at once.
	BurstSize int       `json:"burstSize"`
	Rows      []NodeRow `json:"rows"`
}

// Version is one part of the node comparison: its name, its version and
// where it came from.
type Version struct {
	Part    string `json:"part"`
	Version string `json:"version"`
	From    string `json:"from"`
}

// NodeRow is one way of starting a worker of the C template on the real
// node. A row that was not measured says why in Note.
type NodeRow struct {
	Mode     string `json:"mode"`
	What     string `json:"what"`
	Measured bool   `json:"measured"`
	Note     string `json:"note,omitempty"`
	// Single is one worker at a time, each released (outside the timer)
	// before the next; SamplesMs are its samples, for the plot.
	Single    Summary    `json:"single"`
	SamplesMs []float64  `json:"samplesMs,omitempty"`
	Burst     NodeBurst  `json:"burst"`
	Writes    NodeWrites `json:"writes"`
	Memory    NodeMemory `json:"memory"`
}

// NodeBurst is Size workers started at once, all until their first byte.
type NodeBurst struct {
	Size int `json:"size"`
	// AllServedMs is from the start of the burst until the last worker
	// answered.
	AllServedMs float64 `json:"allServedMs"`
	PerWorker   Summary `json:"perWorker"`
	Errors      int     `json:"errors"`
}

// NodeWrites is what apiserver_request_total counted over the single
// starts, whole cycles (start and release) of Workers workers, less what
// the same cluster writes while idle.
type NodeWrites struct {
	Workers int     `json:"workers"`
	Seconds float64 `json:"seconds"`
	// Delta is every request of the window by "VERB resource".
	Delta map[string]float64 `json:"delta,omitempty"`
	// Writes are the window's writes; IdlePerSecond the rate of writes
	// over an idle window just before, on the same cluster.
	Writes        float64 `json:"writes"`
	IdlePerSecond float64 `json:"idleWritesPerSecond"`
	// PerWorker is (Writes - IdlePerSecond*Seconds) / Workers.
	PerWorker float64 `json:"writesPerWorker"`
}

// NodeMemory is the proportional set size a worker costs, read while the
// burst's workers were all alive, in KiB per worker.
type NodeMemory struct {
	Workers int `json:"workers"`
	// WorkerKiB is the worker's own processes: the container's for a Pod,
	// the fiber (what the grant Pod grew by per fiber) for fiberd.
	WorkerKiB float64 `json:"workerKiB"`
	// PodKiB is the Pod's own machinery per worker: its pause process and
	// containerd shim; for fiberd the grant Pod's (fiberd, zygote, pause,
	// shim) shared by the burst's fibers.
	PodKiB float64 `json:"podKiB"`
	// NodeKiB is kubelet's and containerd's growth per Pod added.
	NodeKiB float64 `json:"nodeKiB"`
	Note    string  `json:"note,omitempty"`
}

// TotalKiB is what one worker costs the node.
func (m NodeMemory) TotalKiB() float64 { return m.WorkerKiB + m.PodKiB + m.NodeKiB }

// SpareRow is the memory the spare fibers of one grant hold while they
// wait: the sum of their Private_Dirty (what the status reports).
type SpareRow struct {
	Template    string  `json:"template"`
	Warm        int     `json:"warm"`
	Ready       int     `json:"ready"`
	MiB         float64 `json:"mib"`
	PerSpareMiB float64 `json:"perSpareMiB"`
	Note        string  `json:"note,omitempty"`
}
