package cli

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttlehq/throttle/limiter"
	"github.com/throttlehq/throttle/limiter/redislimiter"
)

// budgetGauges are throttle_budget_spent and throttle_budget_limit, by
// layer: what each budget layer of limit.extra spent in its current period
// and its allowance, in the prices' currency. Spent is read from Redis for
// a budget without a key; a budget per key (per tenant or campaign) is
// reported with its limit only, since a metric names layers, never keys.
type budgetGauges struct {
	spent, limit *prometheus.GaugeVec
}

// newBudgetGauges registers the budget gauges on reg when layers hold a
// budget, and returns nil otherwise.
func newBudgetGauges(reg prometheus.Registerer, layers []limiter.Layer) *budgetGauges {
	g := &budgetGauges{
		spent: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "throttle_budget_spent",
			Help: "Money a budget layer of limit.extra without a key spent in its current period (per: hour, day or month), in limit.prices.currency, as Redis counts it for every replica.",
		}, []string{"layer"}),
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "throttle_budget_limit",
			Help: "A budget layer's allowance per period, in limit.prices.currency.",
		}, []string{"layer"}),
	}
	n := 0
	for _, l := range layers {
		if l.IsBudget() {
			g.limit.WithLabelValues(l.Name).Set(l.Budget.Float())
			n++
		}
	}
	if n == 0 {
		return nil
	}
	reg.MustRegister(g.spent, g.limit)
	return g
}

// watch sets the spent gauge of every budget of ls without a key every
// interval until ctx ends. A failed read leaves a gauge as it was.
func (g *budgetGauges) watch(ctx context.Context, ls *redislimiter.Layered, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		for _, l := range ls.Layers() {
			if !l.IsBudget() || l.Keyed {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, interval)
			if st, err := ls.LayerStatus(rctx, l.Name, ""); err == nil {
				g.spent.WithLabelValues(l.Name).Set(st.Spent.Float())
			}
			cancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
