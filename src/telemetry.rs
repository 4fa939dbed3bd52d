//! The broker's telemetry file: one JSON line per request
//! (`Output::Telemetry`), appended and flushed record by record, so a
//! crash loses at most the record being written.
//!
//! Telemetry never stops a session: the first write error is reported once
//! on stderr and later records are dropped.
//!
//! A line is the core's record as the file's readers need it: `ts` (UTC,
//! RFC 3339, the moment it was written), `session_id` (as `QUOTA` and the
//! report give it, so sessions appending to one file never mix their call
//! ids), `call_id`, and each amount in USD, as `QUOTA` gives them, with the
//! exact integer in pico-USD beside it (`charged_usd`, `charged_pico`).

use airlock_core::broker::TelemetryRecord;
use anyhow::Context;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub struct TelemetryWriter {
    path: PathBuf,
    session_id: String,
    out: Option<BufWriter<File>>,
    records: u64,
}

impl TelemetryWriter {
    /// Open `path` for appending (created if missing). Failing here is a
    /// start-up error: the config names a file airlock cannot write.
    pub fn open(path: &Path, session_id: &str) -> anyhow::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("broker.telemetry: opening {}", path.display()))?;
        Ok(TelemetryWriter {
            path: path.to_path_buf(),
            session_id: session_id.to_owned(),
            out: Some(BufWriter::new(file)),
            records: 0,
        })
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    pub fn write(&mut self, record: &TelemetryRecord) {
        let Some(out) = &mut self.out else { return };
        let line = line(record, &self.session_id, std::time::SystemTime::now());
        let res = serde_json::to_writer(&mut *out, &line)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        match res {
            Ok(()) => self.records += 1,
            Err(e) => self.fail(&e),
        }
    }

    /// Flush what is buffered (it is already, record by record; this is
    /// for the error report).
    pub fn finish(&mut self) {
        if let Some(out) = &mut self.out {
            if let Err(e) = out.flush() {
                self.fail(&e);
            }
        }
    }

    fn fail(&mut self, e: &std::io::Error) {
        eprintln!("airlock: telemetry {}: {e}; further records are dropped", self.path.display());
        // Discard what is buffered rather than let the drop retry it.
        if let Some(out) = self.out.take() {
            drop(out.into_parts());
        }
    }
}

/// The line written for `record` at `at`.
pub fn line(record: &TelemetryRecord, session_id: &str, at: std::time::SystemTime) -> serde_json::Value {
    let mut value = serde_json::to_value(record).unwrap_or_default();
    let Some(obj) = value.as_object_mut() else { return value };
    if let Some(call) = obj.remove("call") {
        obj.insert("call_id".into(), call);
    }
    for (name, money) in [("charged", record.charged), ("remaining", record.remaining)] {
        obj.remove(name);
        obj.insert(format!("{name}_usd"), money.as_usd_f64().into());
        obj.insert(format!("{name}_pico"), money.as_pico().into());
    }
    obj.insert("session_id".into(), session_id.into());
    obj.insert("ts".into(), rfc3339(at).into());
    value
}

/// `2026-11-23T17:20:01.123Z`.
pub(crate) fn rfc3339(at: std::time::SystemTime) -> String {
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn timestamps_are_utc_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_millis(951_782_400_007)), "2000-02-29T00:00:00.007Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_454_401)), "2026-11-23T17:20:01.000Z");
    }
}
