//! Latency histograms: HdrHistogram in microseconds, 1 µs to 10 minutes, 3 significant
//! digits.

use std::time::Duration;

use hdrhistogram::Histogram;

const MAX_MICROS: u64 = 600_000_000;

#[derive(Clone)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Latency::new()
    }
}

impl Latency {
    pub fn new() -> Latency {
        Latency(Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("valid histogram bounds"))
    }

    pub fn record(&mut self, elapsed: Duration) {
        let micros = (elapsed.as_micros() as u64).clamp(1, MAX_MICROS);
        self.0.saturating_record(micros);
    }

    pub fn merge(&mut self, other: &Latency) {
        self.0.add(&other.0).expect("histograms with the same bounds");
    }

    pub fn count(&self) -> u64 {
        self.0.len()
    }

    /// The value at quantile `q` (0..=1), in milliseconds.
    pub fn ms(&self, q: f64) -> f64 {
        self.0.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn max_ms(&self) -> f64 {
        self.0.max() as f64 / 1000.0
    }

    pub fn mean_ms(&self) -> f64 {
        self.0.mean() / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_back_in_milliseconds() {
        let mut a = Latency::new();
        for ms in 1..=100 {
            a.record(Duration::from_millis(ms));
        }
        let mut b = Latency::new();
        b.record(Duration::from_secs(2));
        a.merge(&b);
        assert_eq!(a.count(), 101);
        assert!((a.ms(0.5) - 51.0).abs() < 0.1, "{}", a.ms(0.5));
        assert!((a.max_ms() - 2000.0).abs() < 2.0);
    }
}
