package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
)

// writeReport prints one database's result as markdown: a table of events per second per round and
// their median, the ratios of the worker's median to the others', the watermill configurations and
// the notes.
func writeReport(w io.Writer, r *result) {
	consumers := "1 consumer"
	if r.cfg.consumers != 1 {
		consumers = strconv.Itoa(r.cfg.consumers) + " consumers at once"
	}
	fmt.Fprintf(w, "### %s: %d events, %d rounds, %s per variant\n\n", r.server, r.cfg.events, r.cfg.rounds, consumers)
	fmt.Fprint(w, "| variant |")
	for i := range r.cfg.rounds {
		fmt.Fprintf(w, " round %d, ev/s |", i+1)
	}
	fmt.Fprint(w, " **median, ev/s** |\n| --- |")
	fmt.Fprint(w, strings.Repeat(" --- |", r.cfg.rounds+1)+"\n")
	medians := map[string]float64{}
	for _, row := range r.rows {
		fmt.Fprintf(w, "| %s |", row.variant)
		for _, rate := range row.rates {
			fmt.Fprintf(w, " %s |", groupThousands(rate))
		}
		m := median(row.rates)
		medians[row.variant] = m
		fmt.Fprintf(w, " **%s** |\n", groupThousands(m))
	}
	fmt.Fprintln(w)
	var ratios []string
	for _, row := range r.rows {
		if !strings.HasPrefix(row.variant, "worker") {
			continue
		}
		for _, other := range []string{"raw", "watermill_tuned", "watermill_default"} {
			ratios = append(ratios, fmt.Sprintf("%s/%s **%.2f**", row.variant, other, medians[row.variant]/medians[other]))
		}
	}
	fmt.Fprintf(w, "Ratios of medians: %s.\n\n", strings.Join(ratios, ", "))
	for _, row := range r.rows {
		if row.describe != "" {
			fmt.Fprintf(w, "- %s: %s\n", row.variant, row.describe)
		}
	}
	for _, n := range r.notes {
		fmt.Fprintf(w, "- %s\n", n)
	}
	fmt.Fprintln(w)
}

// median of the rates (the mean of the middle two for an even count).
func median(rates []float64) float64 {
	if len(rates) == 0 {
		return 0
	}
	s := slices.Clone(rates)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// groupThousands rounds f and writes it with a space between groups of three digits, as
// docs/benchmarks.md does (76 297).
func groupThousands(f float64) string {
	digits := strconv.FormatInt(int64(f+0.5), 10)
	var b strings.Builder
	for i, d := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(' ')
		}
		b.WriteRune(d)
	}
	return b.String()
}
