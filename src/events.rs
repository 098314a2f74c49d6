//! The run's event log: JSON Lines in the run directory. A recording failure never breaks a run:
//! the first write error is logged and the log goes quiet.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

pub struct EventLog {
    out: Option<BufWriter<File>>,
}

impl EventLog {
    pub fn create(path: &Path) -> EventLog {
        match File::create(path) {
            Ok(f) => EventLog { out: Some(BufWriter::new(f)) },
            Err(e) => {
                tracing::warn!("cannot write the event log {}: {e}; going on without it", path.display());
                EventLog { out: None }
            }
        }
    }

    /// Appends `{"ts_ms": …, "event": kind, …fields}` and flushes, so a crash loses nothing.
    pub fn emit(&mut self, kind: &str, fields: Value) {
        let Some(out) = self.out.as_mut() else { return };
        let ts_ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
        let mut line = json!({ "ts_ms": ts_ms, "event": kind });
        if let (Some(obj), Value::Object(more)) = (line.as_object_mut(), fields) {
            obj.extend(more);
        }
        let res = serde_json::to_writer(&mut *out, &line)
            .map_err(std::io::Error::from)
            .and_then(|_| out.write_all(b"\n"))
            .and_then(|_| out.flush());
        if let Err(e) = res {
            tracing::warn!("event log write failed: {e}; no more events will be recorded for this run");
            self.out = None;
        }
    }
}
