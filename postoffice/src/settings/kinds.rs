//! The kinds of value a setting takes: how its text is read, and how the
//! table describes it. One rule for every number: a whole number within its
//! range ([`Numeric`]), sizes with an optional K, M or G.

use pslite_proto::Role;
use pslite_van::AuthToken;

use crate::config::ConfigError;

/// How a variable's text becomes a value, and how the table describes it.
pub trait Kind {
    /// What reading gives.
    type Value;
    /// `raw` (the variable's text, `None` when unset) as a value, or an
    /// error naming `var`. Blank counts as unset, except where it says so.
    fn read(&self, var: &'static str, raw: Option<String>) -> Result<Self::Value, ConfigError>;
    /// The values it takes, for the table.
    fn values(&self) -> String;
    /// What it is when unset, for the table.
    fn default(&self) -> String {
        "unset".into()
    }
    /// Its numeric range, if it is a number.
    fn range(&self) -> Option<Numeric> {
        None
    }
}

/// The text of a set, non-blank variable, trimmed.
fn present(raw: Option<String>) -> Option<String> {
    raw.map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// What a number counts, for parsing (bytes take K, M or G) and messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A plain count (nodes, messages, keys, a level).
    Count,
    /// Seconds.
    Seconds,
    /// Milliseconds.
    Milliseconds,
    /// Bytes, optionally with a K, M or G suffix (KiB, MiB, GiB).
    Bytes,
    /// A percentage.
    Percent,
    /// A TCP port.
    Port,
}

/// The values a numeric variable may take: whole numbers from `min` to
/// `max` (inclusive) of a [`Unit`], with a note on what special values
/// mean. Unset, it reads as `None` (see [`Num`] for one with a default).
///
/// ```
/// use pslite_postoffice::settings::{Numeric, Unit};
///
/// const WARN_AFTER: Numeric = Numeric::new(Unit::Seconds, 0, 86_400).note("0 = never");
/// assert_eq!(WARN_AFTER.parse("MY_WARN", " 30 "), Ok(30));
/// assert_eq!(
///     WARN_AFTER.parse("MY_WARN", "99999").unwrap_err().to_string(),
///     "MY_WARN must be a whole number of seconds from 0 to 86400 (0 = never), got \"99999\""
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Numeric {
    /// What the number counts.
    pub unit: Unit,
    /// The smallest value allowed.
    pub min: u64,
    /// The largest value allowed.
    pub max: u64,
    /// What special values mean (`"0 = off"`), or `""`.
    pub note: &'static str,
}

impl Numeric {
    /// Whole numbers of `unit` from `min` to `max`.
    pub const fn new(unit: Unit, min: u64, max: u64) -> Numeric {
        Numeric {
            unit,
            min,
            max,
            note: "",
        }
    }

    /// The same range, with a note on what special values mean.
    pub const fn note(self, note: &'static str) -> Numeric {
        Numeric { note, ..self }
    }

    /// The same range, `default` when unset.
    pub const fn or(self, default: u64) -> Num {
        Num {
            range: self,
            default,
        }
    }

    /// `value` (surrounding blanks ignored) as a number in this range, or
    /// an error naming `var`, the range and the value.
    pub fn parse(&self, var: &'static str, value: &str) -> Result<u64, ConfigError> {
        let number = match self.unit {
            Unit::Bytes => parse_bytes(value),
            _ => value.trim().parse::<u64>().ok(),
        };
        number
            .filter(|n| (self.min..=self.max).contains(n))
            .ok_or_else(|| ConfigError::OutOfRange {
                var,
                value: value.to_string(),
                range: *self,
            })
    }

    fn text(&self, n: u64) -> String {
        match self.unit {
            Unit::Bytes => bytes_text(n),
            _ => n.to_string(),
        }
    }
}

impl std::fmt::Display for Numeric {
    /// `a whole number of seconds from 0 to 604800 (0 = off)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.unit {
            Unit::Count => "a whole number",
            Unit::Seconds => "a whole number of seconds",
            Unit::Milliseconds => "a whole number of milliseconds",
            Unit::Percent => "a percentage",
            Unit::Port => "a port number",
            Unit::Bytes => "a number of bytes",
        };
        write!(
            f,
            "{what} from {} to {}",
            self.text(self.min),
            self.text(self.max)
        )?;
        if self.unit == Unit::Bytes {
            f.write_str(", optionally with K, M or G (KiB, MiB, GiB)")?;
        }
        if !self.note.is_empty() {
            write!(f, " ({})", self.note)?;
        }
        Ok(())
    }
}

impl Kind for Numeric {
    type Value = Option<u64>;
    fn read(&self, var: &'static str, raw: Option<String>) -> Result<Option<u64>, ConfigError> {
        present(raw).map(|v| self.parse(var, &v)).transpose()
    }
    fn values(&self) -> String {
        self.to_string()
    }
    fn range(&self) -> Option<Numeric> {
        Some(*self)
    }
}

/// A number in a [`Numeric`] range with a default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Num {
    /// The values it takes.
    pub range: Numeric,
    /// Its value when unset.
    pub default: u64,
}

impl Kind for Num {
    type Value = u64;
    fn read(&self, var: &'static str, raw: Option<String>) -> Result<u64, ConfigError> {
        Ok(self.range.read(var, raw)?.unwrap_or(self.default))
    }
    fn values(&self) -> String {
        self.range.to_string()
    }
    fn default(&self) -> String {
        self.range.text(self.default)
    }
    fn range(&self) -> Option<Numeric> {
        Some(self.range)
    }
}

/// `DMLC_NUM_WORKER` or `DMLC_NUM_SERVER`: a fixed number, or `MIN:MAX`
/// (elastic workers; servers that join and leave a running job).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeCount {
    /// ps-lite's fixed number of nodes.
    Fixed(u64),
    /// From MIN to MAX nodes.
    Elastic {
        /// Fewest nodes the job runs with.
        min: u64,
        /// Most nodes at once.
        max: u64,
    },
}

impl NodeCount {
    /// The most nodes at once.
    pub fn max(self) -> u64 {
        match self {
            NodeCount::Fixed(n) => n,
            NodeCount::Elastic { max, .. } => max,
        }
    }
}

impl std::fmt::Display for NodeCount {
    /// `4`, or `2:4`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeCount::Fixed(n) => write!(f, "{n}"),
            NodeCount::Elastic { min, max } => write!(f, "{min}:{max}"),
        }
    }
}

/// A node count: a number in the range, or `MIN:MAX` with both in it and
/// `MIN <= MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nodes(pub Numeric);

impl Nodes {
    /// `value` as a node count, or an error naming `var` and the range.
    pub fn parse(&self, var: &'static str, value: &str) -> Result<NodeCount, ConfigError> {
        let bad = || ConfigError::OutOfRange {
            var,
            value: value.to_string(),
            range: self.0,
        };
        let Some((min, max)) = value.split_once(':') else {
            return Ok(NodeCount::Fixed(
                self.0.parse(var, value).map_err(|_| bad())?,
            ));
        };
        let min = self.0.parse(var, min).map_err(|_| bad())?;
        let max = self.0.parse(var, max).map_err(|_| bad())?;
        if min > max {
            return Err(bad());
        }
        Ok(NodeCount::Elastic { min, max })
    }
}

impl Kind for Nodes {
    type Value = Option<NodeCount>;
    fn read(&self, var: &'static str, raw: Option<String>) -> Result<Self::Value, ConfigError> {
        present(raw).map(|v| self.parse(var, &v)).transpose()
    }
    fn values(&self) -> String {
        self.0.to_string()
    }
    fn range(&self) -> Option<Numeric> {
        Some(self.0)
    }
}

/// On or off: `1`/`true`/`yes`/`on` or `0`/`false`/`no`/`off`, with a
/// default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flag(pub bool);

impl Kind for Flag {
    type Value = bool;
    fn read(&self, var: &'static str, raw: Option<String>) -> Result<bool, ConfigError> {
        Ok(MaybeFlag.read(var, raw)?.unwrap_or(self.0))
    }
    fn values(&self) -> String {
        MaybeFlag.values()
    }
    fn default(&self) -> String {
        if self.0 { "1" } else { "0" }.into()
    }
}

/// On or off, `None` when unset (its default depends on something else).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaybeFlag;

impl Kind for MaybeFlag {
    type Value = Option<bool>;
    fn read(&self, var: &'static str, raw: Option<String>) -> Result<Option<bool>, ConfigError> {
        let Some(value) = present(raw) else {
            return Ok(None);
        };
        match value.to_ascii_lowercase().as_str() {
            "0" | "false" | "no" | "off" => Ok(Some(false)),
            "1" | "true" | "yes" | "on" => Ok(Some(true)),
            _ => Err(ConfigError::Invalid {
                var,
                value,
                expected: "0 or 1",
            }),
        }
    }
    fn values(&self) -> String {
        "0 or 1".into()
    }
}

/// Free text (trimmed; blank is unset); the field says what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Text(pub &'static str);

impl Kind for Text {
    type Value = Option<String>;
    fn read(&self, _: &'static str, raw: Option<String>) -> Result<Option<String>, ConfigError> {
        Ok(present(raw))
    }
    fn values(&self) -> String {
        self.0.into()
    }
}

/// A node's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoleName;

impl Kind for RoleName {
    type Value = Option<Role>;
    fn read(&self, var: &'static str, raw: Option<String>) -> Result<Option<Role>, ConfigError> {
        let Some(value) = present(raw) else {
            return Ok(None);
        };
        value.parse().map(Some).map_err(|_| ConfigError::Invalid {
            var,
            value,
            expected: "scheduler, server or worker",
        })
    }
    fn values(&self) -> String {
        "scheduler, server or worker".into()
    }
}

/// A shared secret: set but empty (`=$UNSET`) is an error, not "off".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Secret;

impl Kind for Secret {
    type Value = Option<AuthToken>;
    fn read(&self, var: &'static str, raw: Option<String>) -> Result<Self::Value, ConfigError> {
        let Some(raw) = raw else {
            return Ok(None);
        };
        match raw.trim() {
            "" => Err(ConfigError::Invalid {
                var,
                value: raw,
                expected: "a secret of 1 to 255 bytes (it is set but empty, e.g. from an unset \
                           shell variable: set it on every node, or unset it to run without \
                           authentication)",
            }),
            v => AuthToken::new(v).map(Some).ok_or(ConfigError::Invalid {
                var,
                value: format!("<{} bytes>", v.len()),
                expected: "a secret of 1 to 255 bytes",
            }),
        }
    }
    fn values(&self) -> String {
        "a secret of 1 to 255 bytes".into()
    }
}

/// A variable every reader needs: unset is an error saying what to set it
/// to (`.1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Required<K>(pub K, pub &'static str);

impl<T, K: Kind<Value = Option<T>>> Kind for Required<K> {
    type Value = T;
    fn read(&self, var: &'static str, raw: Option<String>) -> Result<T, ConfigError> {
        self.0
            .read(var, raw)?
            .ok_or(ConfigError::Missing { var, hint: self.1 })
    }
    fn values(&self) -> String {
        self.0.values()
    }
    fn default(&self) -> String {
        "required".into()
    }
    fn range(&self) -> Option<Numeric> {
        self.0.range()
    }
}

/// `n` bytes with the largest suffix that divides it (`64M`, `1024G`).
pub(crate) fn bytes_text(n: u64) -> String {
    match n {
        0 => "0".into(),
        n if n % (1 << 30) == 0 => format!("{}G", n >> 30),
        n if n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

/// `123`, `64K`, `64M`, `1G` (binary multiples, case-insensitive, an
/// optional trailing `B` or `iB`) as bytes.
pub(crate) fn parse_bytes(value: &str) -> Option<u64> {
    let v = value.trim().to_ascii_lowercase();
    let v = v
        .strip_suffix("ib")
        .or_else(|| v.strip_suffix('b'))
        .unwrap_or(&v);
    let (digits, shift) = match v.char_indices().last()? {
        (i, 'k') => (&v[..i], 10),
        (i, 'm') => (&v[..i], 20),
        (i, 'g') => (&v[..i], 30),
        _ => (v, 0),
    };
    digits.trim().parse::<u64>().ok()?.checked_mul(1 << shift)
}
