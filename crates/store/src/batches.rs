//! The store's own counters of its group commits. The store keeps them
//! where its batches commit and the metrics exporter reads them, so the
//! store never imports the exporter.
//!
//! Invariant: every batch kind a backend names is present from the start,
//! so a scrape shows it at zero before its first commit.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// The kind of batch (`write`; `claim`, `record`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct BatchLabels {
    batch: &'static str,
}

/// The store's group commits, observed where they happen (the SQLite
/// writer thread, the PostgreSQL batchers): how many calls share one
/// commit, and how long it takes. Clones share their counts, so the store
/// keeps one and the metrics registry (`metrics`, which names and exports
/// them) another.
#[derive(Clone)]
pub struct StoreBatches {
    calls: Family<BatchLabels, Histogram>,
    seconds: Family<BatchLabels, Histogram>,
}

impl StoreBatches {
    /// Batches of the kinds `batches` name (`write`; `claim`, `record`),
    /// each exported from the start.
    pub fn new(batches: &[&'static str]) -> Self {
        let calls = Family::<BatchLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0])
        });
        let seconds = Family::<BatchLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ])
        });
        for &batch in batches {
            drop(calls.get_or_create(&BatchLabels { batch }));
            drop(seconds.get_or_create(&BatchLabels { batch }));
        }
        StoreBatches { calls, seconds }
    }

    /// Calls per batch, by kind.
    pub fn calls(&self) -> &Family<BatchLabels, Histogram> {
        &self.calls
    }

    /// Seconds to run and commit a batch, by kind.
    pub fn seconds(&self) -> &Family<BatchLabels, Histogram> {
        &self.seconds
    }

    /// One batch of `calls` calls of kind `batch`, committed (or failed)
    /// after `took`.
    pub fn observe(&self, batch: &'static str, calls: usize, took: Duration) {
        let labels = BatchLabels { batch };
        self.calls.get_or_create(&labels).observe(calls as f64);
        self.seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }
}
