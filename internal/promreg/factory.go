package promreg

import "github.com/prometheus/client_golang/prometheus"

// Factory makes collectors and registers each one on its Registerer as
// Register does: one the Registerer already holds is shared, and every
// other failure is kept for Err. With a nil Registerer the collectors work
// but are not registered (a caller that counts without exporting, or that
// registers them itself).
type Factory struct {
	reg  prometheus.Registerer
	err  error
	made []prometheus.Collector // without a Registerer: what it made, for the caller to register
}

// With returns a Factory that registers on reg (nil: none).
func With(reg prometheus.Registerer) *Factory { return &Factory{reg: reg} }

// Made returns, for a Factory without a Registerer, every collector it
// made, in order (for RegisterEach, where a second registration must fail
// rather than share).
func (f *Factory) Made() []prometheus.Collector { return f.made }

// GaugeFunc makes and registers a gauge whose value fn gives.
func (f *Factory) GaugeFunc(name, help string, fn func() float64) prometheus.GaugeFunc {
	return Add(f, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, fn))
}

// Err returns every registration failure so far, joined; nil if none.
func (f *Factory) Err() error { return f.err }

// Add registers c as f registers the collectors it makes, and returns it
// or the one shared in its place.
func Add[C prometheus.Collector](f *Factory, c C) C {
	if f.reg == nil {
		f.made = append(f.made, c)
		return c
	}
	return Register(f.reg, c, &f.err)
}

// Counter makes and registers a counter.
func (f *Factory) Counter(name, help string) prometheus.Counter {
	return Add(f, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

// CounterVec makes and registers a counter with labels.
func (f *Factory) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return Add(f, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

// Gauge makes and registers a gauge.
func (f *Factory) Gauge(name, help string) prometheus.Gauge {
	return Add(f, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help}))
}

// GaugeVec makes and registers a gauge with labels.
func (f *Factory) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return Add(f, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels))
}

// Histogram makes and registers a histogram with buckets.
func (f *Factory) Histogram(name, help string, buckets []float64) prometheus.Histogram {
	return Add(f, prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}))
}

// HistogramVec makes and registers a histogram with buckets and labels.
func (f *Factory) HistogramVec(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	return Add(f, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels))
}

// RegisterEach registers cs on reg in order, without sharing: the first
// failure (a collector reg already holds, too) ends it and is returned.
func RegisterEach(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
