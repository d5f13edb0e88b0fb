//! [bin] The one way every flag reads and prints a size or a duration.
//!
//! Sizes: bytes, or a number with `K`, `M`, `G` or `T` (powers of 1024; `KiB`, `KB`, `k` read
//! the same): `4096`, `512K`, `1.5G`. Durations: `500ms`, `30s`, `10m`, `2h`, `7d`, or a plain
//! number of seconds (`0.5`). Defaults print in the same form (`4G`, `10m`), the largest unit
//! that divides the value. A limit that can be turned off takes `off` ([`OrOff`]); `0` is then
//! refused, never a second spelling of `off` (docs/mcp-server.md, "Sizes and durations").

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The longest duration a flag keeps (a year): longer values are clamped to it.
const LONGEST: Duration = Duration::from_secs(86_400 * 365);

/// A size flag's value, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Size(pub u64);

const SIZE_UNITS: [(&str, u64); 4] = [
    ("T", 1 << 40),
    ("G", 1 << 30),
    ("M", 1 << 20),
    ("K", 1 << 10),
];

impl FromStr for Size {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let err = || {
            format!(
                "`{text}` is not a size: pass bytes, or a number with K, M, G or T (powers of 1024), e.g. 4096, 512K, 1.5G"
            )
        };
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let unit = unit.trim().to_ascii_uppercase();
        let unit = unit
            .strip_suffix("IB")
            .or_else(|| unit.strip_suffix('B'))
            .unwrap_or(&unit);
        let scale = match unit {
            "" => 1,
            u => SIZE_UNITS
                .iter()
                .find(|(name, _)| *name == u)
                .map(|(_, scale)| *scale)
                .ok_or_else(err)?,
        };
        if number.is_empty() {
            return Err(err());
        }
        if let Ok(n) = number.parse::<u64>() {
            return n.checked_mul(scale).map(Size).ok_or_else(err);
        }
        let bytes = number.parse::<f64>().map_err(|_| err())? * scale as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(err());
        }
        Ok(Size(bytes as u64))
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match SIZE_UNITS
            .iter()
            .find(|(_, scale)| self.0 >= *scale && self.0.is_multiple_of(*scale))
        {
            Some((name, scale)) => write!(f, "{}{name}", self.0 / scale),
            None => write!(f, "{}", self.0),
        }
    }
}

impl Size {
    /// The value as `usize` (what buffers are counted in).
    pub(crate) fn bytes(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

/// A duration flag's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Secs(pub Duration);

const DURATION_UNITS: [(&str, u64); 4] = [
    ("d", 86_400_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1000),
];

impl FromStr for Secs {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let err = || {
            format!(
                "`{text}` is not a duration: pass seconds, or a number with ms, s, m, h or d, e.g. 500ms, 30s, 10m, 7d"
            )
        };
        let t = text.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let millis_per = match unit.trim() {
            "" | "s" => 1000.0,
            "ms" => 1.0,
            u => DURATION_UNITS
                .iter()
                .find(|(name, _)| *name == u)
                .map(|(_, ms)| *ms as f64)
                .ok_or_else(err)?,
        };
        let n: f64 = number.parse().map_err(|_| err())?;
        if !n.is_finite() || n < 0.0 {
            return Err(err());
        }
        let secs = (n * millis_per / 1000.0).min(LONGEST.as_secs_f64());
        Ok(Secs(Duration::from_secs_f64(secs)))
    }
}

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if self.0.is_zero() {
            return write!(f, "0s");
        }
        if self.0 != Duration::from_millis(ms as u64) {
            return write!(f, "{}s", self.0.as_secs_f64());
        }
        match DURATION_UNITS
            .iter()
            .find(|(_, unit)| ms.is_multiple_of(u128::from(*unit)))
        {
            Some((name, unit)) => write!(f, "{}{name}", ms / u128::from(*unit)),
            None => write!(f, "{ms}ms"),
        }
    }
}

impl Secs {
    /// The value, refused when zero: `flag` is what the error names, `zero` what to pass
    /// instead (e.g. "`off` to wait without limit").
    pub(crate) fn positive(self, flag: &str, instead: &str) -> Result<Duration, String> {
        if self.0.is_zero() {
            Err(format!(
                "invalid {flag} 0\n  help: pass a positive duration (500ms, 30s, 10m, 7d){instead}"
            ))
        } else {
            Ok(self.0)
        }
    }
}

/// A limit that `off` turns off: `OrOff(None)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OrOff<T>(pub Option<T>);

impl<T: FromStr<Err = String>> FromStr for OrOff<T> {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        if text.trim() == "off" {
            return Ok(OrOff(None));
        }
        text.parse()
            .map(|v| OrOff(Some(v)))
            .map_err(|e| format!("{e}; or `off`"))
    }
}

impl<T: fmt::Display> fmt::Display for OrOff<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("off"),
        }
    }
}

/// `--FLAG 0` for a limit that `off` turns off: refused (0 is never a second spelling of
/// `off`, nor a limit that admits nothing).
pub(crate) fn nonzero_size(value: OrOff<Size>, flag: &str) -> Result<Option<u64>, String> {
    match value.0 {
        Some(Size(0)) => Err(format!(
            "invalid {flag} 0\n  help: pass a size (512M, 2G), or `off` for no limit"
        )),
        other => Ok(other.map(|s| s.0)),
    }
}

/// Like [`nonzero_size`], for a duration.
pub(crate) fn nonzero_secs(value: OrOff<Secs>, flag: &str) -> Result<Option<Duration>, String> {
    value.0.map(|s| s.positive(flag, ", or `off`")).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(t: &str) -> Result<u64, String> {
        t.parse::<Size>().map(|s| s.0)
    }

    fn secs(t: &str) -> Result<Duration, String> {
        t.parse::<Secs>().map(|s| s.0)
    }

    #[test]
    fn sizes_read_every_unit() {
        assert_eq!(size("4096"), Ok(4096));
        assert_eq!(size("4096B"), Ok(4096));
        assert_eq!(size("512K"), Ok(512 << 10));
        assert_eq!(size("512k"), Ok(512 << 10));
        assert_eq!(size("512KiB"), Ok(512 << 10));
        assert_eq!(size("512KB"), Ok(512 << 10));
        assert_eq!(size("4M"), Ok(4 << 20));
        assert_eq!(size("4MiB"), Ok(4 << 20));
        assert_eq!(size("2G"), Ok(2 << 30));
        assert_eq!(size("1.5G"), Ok(3 << 29));
        assert_eq!(size("1T"), Ok(1 << 40));
        assert_eq!(size(" 8 M "), Ok(8 << 20));
        let refused = "`4X` is not a size: pass bytes, or a number with K, M, G or T (powers of 1024), e.g. 4096, 512K, 1.5G";
        assert_eq!(size("4X"), Err(refused.into()));
        for bad in ["", "M", "-1", "1.2.3K", "99999999999999T", "lots"] {
            assert!(size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_print_in_the_largest_unit_that_divides() {
        for (n, shown) in [
            (4u64 << 30, "4G"),
            (1 << 20, "1M"),
            (16 << 20, "16M"),
            (1536 << 10, "1536K"),
            (1000, "1000"),
            (0, "0"),
        ] {
            assert_eq!(Size(n).to_string(), shown);
            assert_eq!(size(shown), Ok(n));
        }
    }

    #[test]
    fn durations_read_every_unit() {
        assert_eq!(secs("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(secs("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(secs("30"), Ok(Duration::from_secs(30)));
        assert_eq!(secs("0.2"), Ok(Duration::from_millis(200)));
        assert_eq!(secs("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(secs("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(secs("7d"), Ok(Duration::from_secs(604_800)));
        assert_eq!(secs("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(secs("9999d"), Ok(LONGEST));
        let refused = "`7w` is not a duration: pass seconds, or a number with ms, s, m, h or d, e.g. 500ms, 30s, 10m, 7d";
        assert_eq!(secs("7w"), Err(refused.into()));
        for bad in ["", "s", "-1", "1e3", "inf", "NaN", "10 mins"] {
            assert!(secs(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_print_in_the_largest_unit_that_divides() {
        for (d, shown) in [
            (Duration::from_secs(604_800), "7d"),
            (Duration::from_secs(600), "10m"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_millis(500), "500ms"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(Secs(d).to_string(), shown);
            assert_eq!(secs(shown), Ok(d));
        }
    }

    #[test]
    fn off_turns_a_limit_off_and_zero_is_refused() {
        assert_eq!("off".parse::<OrOff<Size>>(), Ok(OrOff(None)));
        assert_eq!("4G".parse::<OrOff<Size>>(), Ok(OrOff(Some(Size(4 << 30)))));
        assert_eq!(OrOff::<Secs>(None).to_string(), "off");
        assert!(
            "never"
                .parse::<OrOff<Secs>>()
                .unwrap_err()
                .ends_with("; or `off`")
        );
        assert_eq!(
            nonzero_size(OrOff(Some(Size(0))), "--snapshot-quota"),
            Err(
                "invalid --snapshot-quota 0\n  help: pass a size (512M, 2G), or `off` for no limit"
                    .into()
            )
        );
        assert_eq!(nonzero_size(OrOff(None), "--x"), Ok(None));
        assert_eq!(
            nonzero_secs(OrOff(Some(Secs(Duration::ZERO))), "--hibernate-after"),
            Err("invalid --hibernate-after 0\n  help: pass a positive duration (500ms, 30s, 10m, 7d), or `off`".into())
        );
        assert_eq!(
            nonzero_secs("10m".parse().unwrap(), "--x"),
            Ok(Some(Duration::from_secs(600)))
        );
    }
}
