// Package stockrows parses the rows a stock load tool is driven at, as
// the overload benchmark's --stock and stockclient's -rows take them:
// comma-separated LOADxWORKERS, an offered load in multiples of the
// capacity and the closed-loop workers that offer it.
package stockrows

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxWorkers bounds a row's workers.
const MaxWorkers = 20000

// Row is load x C calls per second offered by Workers closed-loop callers.
type Row struct {
	Load    float64
	Workers int
}

// Parse parses s; an empty s is no rows. A load must be in (0, 100], the
// workers in [1, MaxWorkers].
func Parse(s string) ([]Row, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var rows []Row
	for _, f := range strings.Split(s, ",") {
		l, w, ok := strings.Cut(strings.TrimSpace(f), "x")
		load, err1 := strconv.ParseFloat(l, 64)
		workers, err2 := strconv.Atoi(w)
		if !ok || err1 != nil || err2 != nil || !(load > 0 && load <= 100) || workers < 1 || workers > MaxWorkers {
			return nil, fmt.Errorf("%q is not LOADxWORKERS with a load in (0, 100] and 1-%d workers", f, MaxWorkers)
		}
		rows = append(rows, Row{load, workers})
	}
	return rows, nil
}
