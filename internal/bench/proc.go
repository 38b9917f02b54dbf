package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// procCPU returns user+system CPU seconds of a process from
// /proc/<pid>/stat.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return float64(ut+st) / clockTicks, nil
}

// rssMB returns the resident set size of a process from /proc/<pid>/status.
func rssMB(pid int) (float64, error) { return procStatusMB(strconv.Itoa(pid), "VmRSS:") }

// procStatusMB reads a kB field of /proc/<pid>/status in MB. The peak RSS
// comes from VmHWM rather than getrusage's ru_maxrss: a child started with
// fork+exec inherits into ru_maxrss the peak of the parent's address
// space at exec (Linux keeps the larger of the two), so for a child of a
// parent that holds the whole stream it reports the parent's size.
func procStatusMB(pid, field string) (float64, error) {
	f, err := os.Open("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, field); ok {
			fs := strings.Fields(rest)
			if len(fs) == 0 {
				break
			}
			kb, err := strconv.ParseFloat(fs[0], 64)
			if err != nil {
				return 0, err
			}
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("/proc/%s/status: no %s", pid, field)
}

// backendCPU sums the CPU time of the Postgres backends serving the
// connections with the given application_name. It fails when their /proc
// entries cannot be read (Postgres elsewhere, or another user's processes
// hidden): then Postgres CPU is reported as n/a.
type backendCPU map[int]float64

func readBackends(ctx context.Context, admin *pgxpool.Pool, app string) (backendCPU, error) {
	rows, err := admin.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	if err != nil {
		return nil, err
	}
	var pids []int
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			rows.Close()
			return nil, err
		}
		pids = append(pids, int(pid))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := backendCPU{}
	for _, pid := range pids {
		s, err := procCPU(pid)
		if err != nil {
			return nil, fmt.Errorf("postgres backend %d: %w", pid, err)
		}
		out[pid] = s
	}
	return out, nil
}

// since is the CPU the backends used after base (a backend not in base
// started after it, so all of its time counts).
func (b backendCPU) since(base backendCPU) float64 {
	var total float64
	for pid, s := range b {
		total += s - base[pid]
	}
	return total
}
