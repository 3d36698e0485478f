//! How long an idle model stays in memory: Ollama's `keep_alive`, as a flag, a model's
//! setting, or a request's field.

use std::time::{Duration, Instant};

/// How long an idle model stays in memory (ollama's `keep_alive`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// Until the memory budget needs its room.
    Forever,
    /// This long after its last request ends (zero: unloaded once its requests end).
    For(Duration),
}

impl KeepAlive {
    /// ollama's forms: a duration (`"30s"`, `"5m"`, `"1h30m"`, `"250ms"`), seconds as a bare
    /// number (`"300"`), `"0"`; a negative one (`"-1"`, `"-1m"`) keeps the model forever.
    pub fn parse(s: &str) -> Result<KeepAlive, String> {
        let s = s.trim();
        let bad = || {
            format!(
                "keep_alive '{s}' is not a duration: give seconds (300), a duration (30s, 5m, \
                 1h30m), 0 to unload after the request, or -1 to keep the model loaded"
            )
        };
        if s.is_empty() {
            return Err(bad());
        }
        if let Some(rest) = s.strip_prefix('-') {
            return match rest.chars().next() {
                Some(c) if c.is_ascii_digit() => Ok(KeepAlive::Forever),
                _ => Err(bad()),
            };
        }
        if let Ok(secs) = s.parse::<f64>() {
            return match secs.is_finite() && secs >= 0.0 {
                true => Ok(KeepAlive::For(Duration::from_secs_f64(secs.min(1e9)))),
                false => Err(bad()),
            };
        }
        let mut total = Duration::ZERO;
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit() && c != '.')
                .ok_or_else(bad)?;
            let value: f64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit())
                .unwrap_or(rest.len());
            let unit = match &rest[..unit_len] {
                "ms" => 1e-3,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(bad()),
            };
            rest = &rest[unit_len..];
            total += Duration::from_secs_f64((value * unit).min(1e9));
        }
        Ok(KeepAlive::For(total))
    }

    /// From a request's JSON: a string as [`KeepAlive::parse`] reads it, or seconds.
    pub fn from_json(value: &serde_json::Value) -> Result<KeepAlive, String> {
        match value {
            serde_json::Value::String(s) => KeepAlive::parse(s),
            serde_json::Value::Number(n) => KeepAlive::parse(&n.to_string()),
            other => Err(format!(
                "keep_alive is {other}; give a duration (\"5m\"), seconds, or -1"
            )),
        }
    }

    /// When a model idle since `since` is to be unloaded (`None`: never).
    pub(crate) fn expiry(self, since: Instant) -> Option<Instant> {
        match self {
            KeepAlive::Forever => None,
            KeepAlive::For(d) => since.checked_add(d),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_reads_ollamas_forms() {
        let secs = |s| KeepAlive::For(Duration::from_secs(s));
        assert_eq!(KeepAlive::parse("5m"), Ok(secs(300)));
        assert_eq!(KeepAlive::parse("1h30m"), Ok(secs(5400)));
        assert_eq!(KeepAlive::parse("300"), Ok(secs(300)));
        assert_eq!(KeepAlive::parse("0"), Ok(secs(0)));
        assert_eq!(
            KeepAlive::parse("250ms"),
            Ok(KeepAlive::For(Duration::from_millis(250)))
        );
        assert_eq!(KeepAlive::parse("-1"), Ok(KeepAlive::Forever));
        assert_eq!(KeepAlive::parse("-1m"), Ok(KeepAlive::Forever));
        assert_eq!(KeepAlive::from_json(&serde_json::json!(2)), Ok(secs(2)));
        assert_eq!(
            KeepAlive::from_json(&serde_json::json!(-1)),
            Ok(KeepAlive::Forever)
        );
        for bad in ["", "5x", "m5", "-", "--1", "NaN", "inf"] {
            let parsed = KeepAlive::parse(bad);
            assert!(parsed.is_err(), "{bad:?} parsed as {parsed:?}");
        }
    }
}
