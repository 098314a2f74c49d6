//! A workload's per-request samples file (`workload.csv`, `api-workload.csv`): one line per
//! request — unix ms at its start, latency µs, 1 = acknowledged / 0 = failed — read by the HTML
//! report's latency and throughput charts.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The samples file, or nothing (no run directory, or it could not be created: a warning, and
/// the workload goes on without it).
#[derive(Debug, Default)]
pub struct Samples(Mutex<Option<BufWriter<File>>>);

impl Samples {
    pub fn create(path: Option<&Path>) -> Samples {
        let sink = path.and_then(|p| match File::create(p) {
            Ok(f) => {
                let mut w = BufWriter::new(f);
                let _ = w.write_all(b"unix_ms,latency_us,ok\n");
                Some(w)
            }
            Err(e) => {
                tracing::warn!("cannot write workload samples to {}: {e}; going on without them", p.display());
                None
            }
        });
        Samples(Mutex::new(sink))
    }

    /// Appends one request's outcome.
    pub fn sample(&self, started_unix_ms: u64, latency: Duration, ok: bool) {
        if let Some(w) = self.0.lock().expect("samples lock").as_mut() {
            let _ = writeln!(w, "{started_unix_ms},{},{}", latency.as_micros(), u8::from(ok));
        }
    }

    /// Appends one request that started at `started` and ended now.
    pub fn sample_since(&self, started: SystemTime, ok: bool) {
        let unix_ms = started.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        self.sample(unix_ms, started.elapsed().unwrap_or_default(), ok);
    }

    pub fn flush(&self) {
        if let Some(w) = self.0.lock().expect("samples lock").as_mut() {
            let _ = w.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_written_as_the_report_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("workload.csv");
        let s = Samples::create(Some(&path));
        s.sample(1_000, Duration::from_micros(1_500), true);
        s.sample(2_000, Duration::from_millis(3), false);
        s.flush();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "unix_ms,latency_us,ok\n1000,1500,1\n2000,3000,0\n");
        // No file, no panic.
        Samples::create(None).sample(1, Duration::ZERO, true);
    }
}
