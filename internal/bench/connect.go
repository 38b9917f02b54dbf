package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/projector-dev/projector/internal/demo"
	"github.com/projector-dev/projector/sinks/postgres"
)

// The Kafka Connect peer (ModeConnectJDBC) is what many users deploy today
// for this job: a Kafka Connect worker running the Debezium JDBC sink
// connector, which upserts every record into a table by its key. It has no
// version gate: the row holds whatever event of its aggregate came last in
// the log, so an event that arrives after a newer one of its account
// overwrites it. The benchmark gives it the same events as every other
// peer, in JSON with schemas (what JsonConverter reads), on a topic of
// their own, and a snapshot table shaped as the engine's snapshot
// projection creates it; its differences from the reference fold are a
// result, as the upsert peer's are.
//
// The child process of this mode owns the worker's JVM: it starts it with
// scripts/connect in a process group of its own, creates the connector
// when the window opens, and stops the JVM (SIGTERM, then SIGKILL) before
// it exits; the JVM is also killed if the child dies.

// ConnectSpec configures the Kafka Connect peer in a child.
type ConnectSpec struct {
	// Script is scripts/connect, which fetches Kafka Connect and the
	// connector and runs a standalone worker.
	Script string `json:"script"`
	// Tasks is the connector's tasks.max.
	Tasks int `json:"tasks"`
	// Config holds connector settings that override or add to
	// connectConfig's (batch.size, use.reduction.buffer, ...).
	Config map[string]string `json:"config,omitempty"`
}

// connectSinkClass is the connector's class.
const connectSinkClass = "io.debezium.connector.jdbc.JdbcSinkConnector"

// connectFlushInterval is the worker's offset.flush.interval.ms: how
// often a sink task commits the offsets of what it has written. The run
// ends when the committed offsets reach the end of the topic, so it bounds
// how late the end is seen (Connect's default is a minute).
const connectFlushInterval = 250 * time.Millisecond

// connectStartTimeout bounds the worker's start, until its REST API lists
// the connector.
const connectStartTimeout = 3 * time.Minute

// connectConfig is the connector's configuration: upsert by the record
// key, deletes on tombstones, into the table the run created (no schema
// evolution), with Connect's own ReplaceField transform fitting the event
// to the table's columns (type → kind; owner and padding dropped).
func connectConfig(topic, table string, tasks int, jdbc jdbcTarget) map[string]string {
	return map[string]string{
		"connector.class":        connectSinkClass,
		"tasks.max":              strconv.Itoa(tasks),
		"topics":                 topic,
		"connection.url":         jdbc.url,
		"connection.username":    jdbc.user,
		"connection.password":    jdbc.password,
		"insert.mode":            "upsert",
		"delete.enabled":         "true",
		"primary.key.mode":       "record_key",
		"primary.key.fields":     "account_id",
		"schema.evolution":       "none",
		"table.name.format":      table,
		"transforms":             "fit",
		"transforms.fit.type":    "org.apache.kafka.connect.transforms.ReplaceField$Value",
		"transforms.fit.exclude": "owner,padding",
		"transforms.fit.renames": "type:kind",
		// A sink consumer starts at the earliest offset unless told
		// otherwise; said here so that nobody has to know it.
		"consumer.override.auto.offset.reset": "earliest",
	}
}

// jdbcTarget is a Postgres URL as the JDBC driver takes it.
type jdbcTarget struct {
	url, user, password string
	schema              string // the run's schema (search_path)
}

// jdbcFromURL turns a postgres:// URL into a JDBC URL for the PostgreSQL
// driver: host, port and database, search_path as currentSchema,
// application_name as ApplicationName (so that the run's Postgres backends
// are found by it, as every peer's), sslmode as it is; user and password
// apart.
func jdbcFromURL(raw string) (jdbcTarget, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return jdbcTarget{}, errors.New("connect-jdbc: the database URL must be a postgres:// URL")
	}
	host := u.Hostname()
	if host == "" || strings.Contains(host, ",") {
		return jdbcTarget{}, errors.New("connect-jdbc: the database URL must name one host")
	}
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	q := u.Query()
	params := url.Values{}
	t := jdbcTarget{user: u.User.Username(), schema: q.Get("search_path")}
	t.password, _ = u.User.Password()
	if t.schema != "" {
		params.Set("currentSchema", t.schema)
	}
	if app := q.Get("application_name"); app != "" {
		params.Set("ApplicationName", app)
	}
	if mode := q.Get("sslmode"); mode != "" {
		params.Set("sslmode", mode)
	}
	t.url = "jdbc:postgresql://" + host + ":" + port + "/" + strings.TrimPrefix(u.Path, "/")
	if len(params) > 0 {
		t.url += "?" + params.Encode()
	}
	return t, nil
}

// connectTopic is the stream in JSON with schemas, produced once per
// dataset.
type connectTopic struct {
	topic      string
	end        map[int32]int64
	valueBytes float64
}

// connectTopicOf produces ds's events to a topic of their own, keyed and
// valued as JsonConverter with schemas reads them, the first time a run
// asks for it.
func (b *bench) connectTopicOf(ctx context.Context, ds *dataset) (*connectTopic, error) {
	if ct := b.connectTopics[ds]; ct != nil {
		return ct, nil
	}
	if ds.records == nil {
		return nil, errors.New("connect-jdbc: the dataset's records were dropped")
	}
	began := time.Now()
	ct := &connectTopic{topic: ds.topic + "-json"}
	if _, err := b.adm.CreateTopic(ctx, int32(b.cfg.Partitions), -1, nil, ct.topic); err != nil {
		return nil, fmt.Errorf("create topic %s: %w", ct.topic, err)
	}
	b.topics = append(b.topics, ct.topic)
	var (
		mu       sync.Mutex
		firstErr error
		total    int64
		scratch  []byte
	)
	const chunk = 20_000
	for start := 0; start < len(ds.records); start += chunk {
		recs := ds.records[start:min(start+chunk, len(ds.records))]
		arena := make([]byte, 0, len(recs)*(len(connectValueSchema)+b.cfg.ValueBytes+200))
		for _, r := range recs {
			from := len(arena)
			arena = appendConnectKey(arena, r.Key)
			key := arena[from:len(arena):len(arena)]
			var value []byte
			if !r.Tombstone {
				from = len(arena)
				arena, scratch = appendConnectValue(arena, scratch, r.Event, b.cfg.ValueBytes)
				value = arena[from:len(arena):len(arena)]
				total += int64(len(value))
			}
			b.prod.Produce(ctx, &kgo.Record{Topic: ct.topic, Key: key, Value: value}, func(_ *kgo.Record, err error) {
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			})
		}
	}
	if err := b.prod.Flush(ctx); err != nil {
		return nil, err
	}
	if firstErr != nil {
		return nil, fmt.Errorf("produce %s: %w", ct.topic, firstErr)
	}
	ct.valueBytes = float64(total) / float64(max(1, len(ds.records)))
	var err error
	if ct.end, err = endOffsets(ctx, b.adm, ct.topic); err != nil {
		return nil, err
	}
	b.logf("%s: %d events produced in JSON with schemas in %.1fs (values %.0f bytes on average)", ct.topic, len(ds.records), time.Since(began).Seconds(), ct.valueBytes)
	if b.connectTopics == nil {
		b.connectTopics = map[*dataset]*connectTopic{}
	}
	b.connectTopics[ds] = ct
	return ct, nil
}

// endOffsets lists the end offset of every partition of topic.
func endOffsets(ctx context.Context, adm *kadm.Client, topic string) (map[int32]int64, error) {
	lo, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", topic, err)
	}
	end := map[int32]int64{}
	var ferr error
	lo.Each(func(o kadm.ListedOffset) {
		if o.Err != nil && ferr == nil {
			ferr = fmt.Errorf("end offset of %s/%d: %w", topic, o.Partition, o.Err)
		}
		end[o.Partition] = o.Offset
	})
	return end, ferr
}

// runConnectPeer runs the Kafka Connect peer over ds and checks its table
// against the last event of every account.
func (b *bench) runConnectPeer(ctx context.Context, ds *dataset) (*Sample, error) {
	ct, err := b.connectTopicOf(ctx, ds)
	if err != nil {
		return nil, err
	}
	spec := WorkerSpec{
		Mode: ModeConnectJDBC, Topic: ct.topic, Partitions: b.cfg.Partitions, End: ct.end,
		Gen: ds.opts, ValueBytes: b.cfg.ValueBytes,
		Connect: &ConnectSpec{Script: b.cfg.ConnectScript, Tasks: b.cfg.ConnectTasks, Config: b.cfg.ConnectConfig},
	}
	s, err := b.runChild(ctx, spec, nil, func(ctx context.Context, pool *pgxpool.Pool, res *WorkerResult) error {
		params := pool.Config().ConnConfig.RuntimeParams
		if n, err := b.tableWrites(ctx, params["application_name"], params["search_path"], SnapshotTable); err != nil {
			b.logf("connect-jdbc: row writes not read: %v", err)
		} else {
			res.RowWrites = n
		}
		diffs, err := snapshotDiffs(ctx, pool, ds.records)
		if err != nil {
			return err
		}
		stale, reordered := lastWriteWins(ds.records)
		res.Note = fmt.Sprintf("last write wins predicts %s accounts differ (their last record a stale copy for %s, an event that arrived after a newer one for %s)",
			group(int64(stale+reordered)), group(int64(stale)), group(int64(reordered)))
		if len(diffs) != stale+reordered {
			res.Note += fmt.Sprintf(", %s do", group(int64(len(diffs))))
		} else {
			res.Note += ", as many do"
		}
		if len(diffs) > 0 {
			return &mismatches{table: SnapshotTable, diffs: diffs}
		}
		return nil
	})
	if s != nil {
		s.Result.Peer += fmt.Sprintf(", JSON values of %.0f bytes on average", ct.valueBytes)
	}
	return s, err
}

// lastWriteWins counts the accounts whose last record in the stream is
// not their newest version: the rows a sink that writes every record over
// the last one gets wrong. stale counts those whose last record is a copy
// of a version sent before, reordered those whose last record is the first
// of its version (an event overtaken by a newer one). A key's records keep
// their order in its partition.
func lastWriteWins(records []demo.Record) (stale, reordered int) {
	type acc struct {
		newest, last int64
		lastIsCopy   bool
		seen         map[int64]bool
	}
	accs := map[string]*acc{}
	for _, r := range records {
		if r.Tombstone {
			continue
		}
		a := accs[r.Key]
		if a == nil {
			a = &acc{seen: map[int64]bool{}}
			accs[r.Key] = a
		}
		v := r.Event.Version
		a.newest, a.last, a.lastIsCopy = max(a.newest, v), v, a.seen[v]
		a.seen[v] = true
	}
	for _, a := range accs {
		switch {
		case a.last == a.newest:
		case a.lastIsCopy:
			stale++
		default:
			reordered++
		}
	}
	return stale, reordered
}

// tableWrites reads the rows inserted, updated and deleted in schema's
// table, once the backends of the application app have gone: a backend
// hands over the statistics it gathers when it has been idle a while, or
// when it exits.
func (b *bench) tableWrites(ctx context.Context, app, schema, table string) (int64, error) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		var n int
		if err := b.admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d backends of %s still open", n, app)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var n int64
	err := b.admin.QueryRow(ctx, `SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`, schema, table).Scan(&n)
	return n, err
}

// connectWorker is a standalone Connect worker's JVM, owned by the child
// that started it.
type connectWorker struct {
	cmd     *exec.Cmd
	logPath string
	rest    string // http://127.0.0.1:port
	http    *http.Client
	exited  chan struct{}
	waitErr error
}

// startConnectWorker fetches Connect and the connector when they are not
// cached yet, writes the worker's properties into dir and starts the
// worker's JVM in a process group of its own, logging to dir.
func startConnectWorker(ctx context.Context, spec ConnectSpec, brokers []string, dir string, stderr io.Writer) (*connectWorker, error) {
	fetch := exec.CommandContext(ctx, spec.Script, "fetch")
	fetch.Stdout, fetch.Stderr = stderr, stderr
	if err := fetch.Run(); err != nil {
		return nil, fmt.Errorf("%s fetch: %w", spec.Script, err)
	}
	port, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	base, err := exec.CommandContext(ctx, spec.Script, "worker-config", "--brokers", strings.Join(brokers, ","),
		"--rest-port", strconv.Itoa(port), "--offsets", filepath.Join(dir, "offsets")).Output()
	if err != nil {
		return nil, fmt.Errorf("%s worker-config: %w", spec.Script, err)
	}
	props := string(base) + fmt.Sprintf("offset.flush.interval.ms=%d\n", connectFlushInterval.Milliseconds())
	workerProps := filepath.Join(dir, "worker.properties")
	if err := os.WriteFile(workerProps, []byte(props), 0o600); err != nil {
		return nil, err
	}
	w := &connectWorker{logPath: filepath.Join(dir, "connect.log"), rest: "http://127.0.0.1:" + strconv.Itoa(port),
		http: &http.Client{Timeout: 15 * time.Second}, exited: make(chan struct{})}
	logf, err := os.Create(w.logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	// Not CommandContext: stop sends SIGTERM to the whole group and waits,
	// which a context's kill would cut short.
	w.cmd = exec.Command(spec.Script, "standalone", workerProps)
	w.cmd.Stdout, w.cmd.Stderr = logf, logf
	// A group of its own, so that a terminal's Ctrl-C reaches the child,
	// which stops the worker, and the death signal kills the worker if the
	// child dies first.
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := w.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start Kafka Connect: %w", err)
	}
	go func() {
		w.waitErr = w.cmd.Wait()
		close(w.exited)
	}()
	return w, nil
}

// stop ends the worker: SIGTERM to its process group (a clean shutdown
// commits its offsets), SIGKILL after a grace period; it returns once the
// JVM has exited. It may be called more than once.
func (w *connectWorker) stop() {
	select {
	case <-w.exited:
		return
	default:
	}
	pgid := w.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-w.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-w.exited
	}
}

// logTail returns the last lines of the worker's log.
func (w *connectWorker) logTail(lines int) string {
	b, err := os.ReadFile(w.logPath)
	if err != nil {
		return ""
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// exitedErr is the error for a worker that exited by itself.
func (w *connectWorker) exitedErr() error {
	return fmt.Errorf("Kafka Connect exited (%v); the end of its log:\n%s", w.waitErr, w.logTail(40))
}

// call makes a REST call and decodes a JSON answer into out (if not nil).
func (w *connectWorker) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, w.rest+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(raw))
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// waitReady waits until the worker's REST API answers and lists the
// connector's plugin, and returns the versions of both.
func (w *connectWorker) waitReady(ctx context.Context) (connectVersion, sinkVersion string, err error) {
	deadline := time.NewTimer(connectStartTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		var root struct {
			Version string `json:"version"`
		}
		var plugins []struct {
			Class   string `json:"class"`
			Version string `json:"version"`
		}
		if err := w.call(ctx, http.MethodGet, "/", nil, &root); err == nil {
			if err := w.call(ctx, http.MethodGet, "/connector-plugins", nil, &plugins); err == nil {
				for _, p := range plugins {
					if p.Class == connectSinkClass {
						return root.Version, p.Version, nil
					}
				}
				return "", "", fmt.Errorf("Kafka Connect %s does not list %s among its plugins; the end of its log:\n%s", root.Version, connectSinkClass, w.logTail(40))
			}
		}
		select {
		case <-tick.C:
		case <-w.exited:
			return "", "", w.exitedErr()
		case <-deadline.C:
			return "", "", fmt.Errorf("Kafka Connect did not answer on %s within %s; the end of its log:\n%s", w.rest, connectStartTimeout, w.logTail(40))
		case <-ctx.Done():
			return "", "", ctx.Err()
		}
	}
}

// connectorStatus is GET /connectors/<name>/status.
type connectorStatus struct {
	Connector struct {
		State string `json:"state"`
		Trace string `json:"trace"`
	} `json:"connector"`
	Tasks []connectTaskStatus `json:"tasks"`
}

type connectTaskStatus struct {
	ID    int    `json:"id"`
	State string `json:"state"`
	Trace string `json:"trace"`
}

// failure returns the connector's or a task's failure, if any.
func (s *connectorStatus) failure() error {
	if s.Connector.State == "FAILED" {
		return fmt.Errorf("the connector failed: %s", firstLines(s.Connector.Trace, 40))
	}
	for _, t := range s.Tasks {
		if t.State == "FAILED" {
			return fmt.Errorf("task %d failed: %s", t.ID, firstLines(t.Trace, 40))
		}
	}
	return nil
}

// running reports whether the connector and all of its tasks run.
func (s *connectorStatus) running(tasks int) bool {
	if s.Connector.State != "RUNNING" || len(s.Tasks) < tasks {
		return false
	}
	return !slices.ContainsFunc(s.Tasks, func(t connectTaskStatus) bool { return t.State != "RUNNING" })
}

func firstLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// freeLoopbackPort returns a TCP port on 127.0.0.1 that was free a moment
// ago.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// runConnectJDBC is the child of the Kafka Connect peer. Before the
// window: the snapshot table, a running worker without connectors. In the
// window: create the connector, and wait until its consumer group
// (connect-<name>) has committed every partition's end offset. The CPU and
// peak RSS it reports are the worker JVM's and its own.
func runConnectJDBC(ctx context.Context, e *runEnv) error {
	spec := e.spec
	if spec.Connect == nil || spec.Connect.Script == "" {
		return errors.New("connect-jdbc: no Connect script")
	}
	tasks := max(1, spec.Connect.Tasks)
	jdbc, err := jdbcFromURL(spec.DatabaseURL)
	if err != nil {
		return err
	}
	if jdbc.schema == "" {
		return errors.New("connect-jdbc: the database URL names no search_path")
	}
	pool, err := openPool(ctx, spec.DatabaseURL, nil, 0)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	// The table exactly as the engine's snapshot projection creates it,
	// so that every snapshot row is checked the same way.
	projs, err := Projections(ModeEngineSnapshot, spec.Topic)
	if err != nil {
		return err
	}
	if err := postgres.Migrate(ctx, pool, projs...); err != nil {
		return fmt.Errorf("create %s: %w", SnapshotTable, err)
	}
	// Only the JVM's connections may carry the run's application_name
	// from here on: the parent finds its Postgres backends by it.
	pool.Close()

	dir, err := os.MkdirTemp("", "projector-bench-connect-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	w, err := startConnectWorker(ctx, *spec.Connect, spec.Brokers, dir, e.stderr)
	if err != nil {
		return err
	}
	defer w.stop()
	connectVersion, sinkVersion, err := w.waitReady(ctx)
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(spec.Brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	name := spec.Identity
	group := "connect-" + name
	config := connectConfig(spec.Topic, jdbc.schema+"."+SnapshotTable, tasks, jdbc)
	maps.Copy(config, spec.Connect.Config)

	if err := e.ready(ctx); err != nil {
		return err
	}
	jvm := w.cmd.Process.Pid
	jvmCPU0, _ := procCPU(jvm)
	if err := w.call(ctx, http.MethodPut, "/connectors/"+url.PathEscape(name)+"/config", config, nil); err != nil {
		return fmt.Errorf("create the connector: %w", err)
	}
	end := <-e.endOffsets()
	res := &WorkerResult{}
	var (
		doneAt       time.Time
		lastSum      int64 = -1
		lastProgress       = time.Now()
		lastStatus   time.Time
	)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for doneAt.IsZero() {
		select {
		case <-tick.C:
		case <-w.exited:
			return w.exitedErr()
		case <-ctx.Done():
			return ctx.Err()
		}
		if time.Since(lastStatus) >= time.Second || res.JoinSeconds == 0 {
			var st connectorStatus
			if err := w.call(ctx, http.MethodGet, "/connectors/"+url.PathEscape(name)+"/status", nil, &st); err == nil {
				if err := st.failure(); err != nil {
					return fmt.Errorf("Kafka Connect: %w", err)
				}
				if res.JoinSeconds == 0 && st.running(tasks) {
					res.JoinSeconds = time.Since(e.start).Seconds()
				}
			}
			lastStatus = time.Now()
		}
		// Until the group has committed, it may not exist: no offsets.
		committed, _ := adm.FetchOffsets(ctx, group)
		var sum int64
		reached := true
		for p, o := range end {
			c := int64(0)
			if off, ok := committed.Lookup(spec.Topic, p); ok && off.Err == nil {
				c = off.At
			}
			sum += c
			if c < o {
				reached = false
			}
		}
		if reached {
			doneAt = time.Now()
			break
		}
		if sum != lastSum {
			lastSum, lastProgress = sum, time.Now()
		} else if time.Since(lastProgress) > stallAfter {
			return fmt.Errorf("connect-jdbc stalled: %d of %d events committed, none for %s; the end of Connect's log:\n%s",
				sum, total(end), stallAfter, w.logTail(20))
		}
	}
	jvmCPU1, _ := procCPU(jvm)
	e.finish(res, doneAt)
	res.CPUSeconds += jvmCPU1 - jvmCPU0
	if mb, err := procStatusMB(strconv.Itoa(jvm), "VmHWM:"); err == nil {
		res.PeakRSSMB += mb
	}
	res.Events = total(end)
	res.Committed = end
	res.Peer = fmt.Sprintf("Kafka Connect %s (standalone worker), Debezium JDBC sink %s, %d task(s), insert.mode upsert by record key",
		connectVersion, sinkVersion, tasks)
	if len(spec.Connect.Config) > 0 {
		var set []string
		for _, k := range slices.Sorted(maps.Keys(spec.Connect.Config)) {
			if !strings.Contains(k, "password") {
				set = append(set, k+"="+spec.Connect.Config[k])
			}
		}
		res.Peer += ", " + strings.Join(set, " ")
	}
	// Offsets are committed after the rows they cover: the table must
	// not change any more.
	if err := tableStable(ctx, spec.DatabaseURL); err != nil {
		return err
	}
	e.report(ctx, res)
	return nil
}

// tableStable checks that the snapshot table's row count stays the same
// over half a second, on a connection that does not count as the run's.
func tableStable(ctx context.Context, dbURL string) error {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "projector-bench"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	count := func() (n int64, err error) {
		err = pool.QueryRow(ctx, `SELECT count(*) FROM `+SnapshotTable).Scan(&n)
		return n, err
	}
	a, err := count()
	if err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	b, err := count()
	if err != nil {
		return err
	}
	if a != b {
		return fmt.Errorf("connect-jdbc: %s went from %d to %d rows after every offset was committed", SnapshotTable, a, b)
	}
	return nil
}
