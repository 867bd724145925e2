//! A table's configuration ([`TableConfig`]): its dimension, how a new row
//! is initialised, the row-wise optimizer that applies pushed gradients,
//! and the record of `u32` words a worker sends it in (a push with
//! [`super::CONFIG`], the words carried as float32 bit patterns; the
//! servers never do arithmetic on them).
//!
//! Words: `[version, table, dim, optimizer, lr, eps, beta1, beta2,
//! initial_accumulator, init, init_a, init_b, seed_lo, seed_hi,
//! expire_after, admit_after, name_len, name bytes (little-endian, 4 a
//! word)...]`; float settings as f32 bits; settings an optimizer or
//! initializer does not use are 0. Version 1 (read still, from older
//! checkpoints) has no `expire_after` and `admit_after` words: both 0.

use std::fmt;

/// The version word of a configuration record.
const VERSION: u32 = 2;
/// Words before the name (version 2; version 1 had 13 + 2).
const HEAD: usize = 17;
/// The largest `expire_after` (steps) and `admit_after` (pushes).
pub const MAX_EXPIRE_AFTER: u32 = 1 << 30;
/// The largest `admit_after`.
pub const MAX_ADMIT_AFTER: u32 = 1 << 16;
/// The longest table name, in bytes.
pub const MAX_NAME: usize = 256;
/// The largest row, in float32 values.
pub const MAX_DIM: u32 = 1 << 16;

/// How a row is initialised the first time it is touched (pulled or
/// pushed): from the table's seed and the row's key only, so replicas
/// and reruns create the same row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Every value 0.
    Zeros,
    /// Uniform in `[low, high)`.
    Uniform {
        /// The lowest value.
        low: f32,
        /// The bound above every value.
        high: f32,
    },
    /// Normal with mean 0 and standard deviation `std`.
    Normal {
        /// The standard deviation.
        std: f32,
    },
}

/// The row-wise optimizer a table applies to each pushed gradient `g` of
/// a row `w` (float32 arithmetic; the row's mean of `g²` summed in
/// float64 and rounded once).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// `w -= lr * g`. No state.
    Sgd {
        /// The learning rate.
        lr: f32,
    },
    /// Row-wise AdaGrad (FBGEMM's and TorchRec's `ROWWISE_ADAGRAD`): one
    /// accumulator per row, `G += mean(g²)`, `w -= (lr / (sqrt(G) + eps)) * g`.
    /// State: 1 word a row.
    AdaGrad {
        /// The learning rate.
        lr: f32,
        /// Added to the root of the accumulator.
        eps: f32,
        /// The accumulator of a new row.
        initial_accumulator: f32,
    },
    /// Row-wise Adam (FBGEMM's `PARTIAL_ROWWISE_ADAM`): a first moment per
    /// value, a second moment and a step count per row. `t += 1`,
    /// `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) mean(g²)`,
    /// `w -= (lr / ((1 - b1^t) (sqrt(v / (1 - b2^t)) + eps))) * m`.
    /// State: `dim + 2` words a row.
    Adam {
        /// The learning rate.
        lr: f32,
        /// The first moment's decay.
        beta1: f32,
        /// The second moment's decay.
        beta2: f32,
        /// Added to the root of the second moment.
        eps: f32,
    },
}

impl Optimizer {
    /// Words of optimizer state per row of `dim` values.
    pub fn state_words(&self, dim: usize) -> usize {
        match self {
            Optimizer::Sgd { .. } => 0,
            Optimizer::AdaGrad { .. } => 1,
            Optimizer::Adam { .. } => dim + 2,
        }
    }
}

/// One table's configuration, the same on every server and worker.
#[derive(Clone, Debug, PartialEq)]
pub struct TableConfig {
    /// The table's id (the low bits of the requests' `cmd`).
    pub table: u32,
    /// The table's name, for errors.
    pub name: String,
    /// Values per row.
    pub dim: u32,
    /// How new rows are initialised.
    pub init: Init,
    /// The seed of the initializer.
    pub seed: u64,
    /// The row-wise optimizer.
    pub optimizer: Optimizer,
    /// Rows untouched by pushes for this many steps (a step: one push of
    /// the table from each worker, counted per key range) are dropped; 0:
    /// never (`embedding/lifecycle.rs`).
    pub expire_after: u32,
    /// An id gets a row at the push that carries it for the
    /// `admit_after`-th time; 0 or 1: at the first.
    pub admit_after: u32,
}

impl TableConfig {
    /// The record of words (see the module's doc).
    pub fn to_words(&self) -> Vec<u32> {
        let (kind, lr, eps, b1, b2, acc) = match self.optimizer {
            Optimizer::Sgd { lr } => (0, lr, 0.0, 0.0, 0.0, 0.0),
            Optimizer::AdaGrad {
                lr,
                eps,
                initial_accumulator,
            } => (1, lr, eps, 0.0, 0.0, initial_accumulator),
            Optimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => (2, lr, eps, beta1, beta2, 0.0),
        };
        let (init, a, b) = match self.init {
            Init::Zeros => (0, 0.0, 0.0),
            Init::Uniform { low, high } => (1, low, high),
            Init::Normal { std } => (2, std, 0.0),
        };
        let name = self.name.as_bytes();
        let mut words = vec![
            VERSION,
            self.table,
            self.dim,
            kind,
            f32::to_bits(lr),
            f32::to_bits(eps),
            f32::to_bits(b1),
            f32::to_bits(b2),
            f32::to_bits(acc),
            init,
            f32::to_bits(a),
            f32::to_bits(b),
            self.seed as u32,
            (self.seed >> 32) as u32,
            self.expire_after,
            self.admit_after,
            name.len() as u32,
        ];
        for chunk in name.chunks(4) {
            let mut w = [0u8; 4];
            w[..chunk.len()].copy_from_slice(chunk);
            words.push(u32::from_le_bytes(w));
        }
        words
    }

    /// Reads a record of words; the error says what is wrong with it.
    pub fn from_words(words: &[u32]) -> Result<TableConfig, String> {
        let head = match words.first() {
            Some(1) => HEAD - 2,
            Some(&VERSION) => HEAD,
            Some(v) => {
                return Err(format!(
                    "a table's configuration of version {v} (this server reads versions 1 to \
                     {VERSION}: upgrade the servers)"
                ))
            }
            None => 0,
        };
        if head == 0 || words.len() < head {
            return Err(format!(
                "a table's configuration has {} words, at least {head} expected",
                words.len()
            ));
        }
        let f = |i: usize| f32::from_bits(words[i]);
        let name_len = words[head - 1] as usize;
        if name_len > MAX_NAME || words.len() != head + name_len.div_ceil(4) {
            return Err(format!(
                "a table's configuration has {} words for a name of {name_len} bytes",
                words.len()
            ));
        }
        let (expire_after, admit_after) = if head == HEAD {
            (words[14], words[15])
        } else {
            (0, 0)
        };
        let bytes: Vec<u8> = words[head..]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .take(name_len)
            .collect();
        let name =
            String::from_utf8(bytes).map_err(|_| "a table's name is not UTF-8".to_string())?;
        let optimizer = match words[3] {
            0 => Optimizer::Sgd { lr: f(4) },
            1 => Optimizer::AdaGrad {
                lr: f(4),
                eps: f(5),
                initial_accumulator: f(8),
            },
            2 => Optimizer::Adam {
                lr: f(4),
                eps: f(5),
                beta1: f(6),
                beta2: f(7),
            },
            k => return Err(format!("table {name:?}: unknown optimizer {k}")),
        };
        let init = match words[9] {
            0 => Init::Zeros,
            1 => Init::Uniform {
                low: f(10),
                high: f(11),
            },
            2 => Init::Normal { std: f(10) },
            k => return Err(format!("table {name:?}: unknown initializer {k}")),
        };
        let config = TableConfig {
            table: words[1],
            name,
            dim: words[2],
            init,
            seed: u64::from(words[12]) | (u64::from(words[13]) << 32),
            optimizer,
            expire_after,
            admit_after,
        };
        config.check()?;
        Ok(config)
    }

    /// Whether the settings are usable; else why not, naming the table.
    pub fn check(&self) -> Result<(), String> {
        let name = &self.name;
        if self.table == 0 || self.table > super::TABLE_MASK as u32 {
            return Err(format!(
                "table {name:?}: id {} is outside 1..={}",
                self.table,
                super::TABLE_MASK
            ));
        }
        if self.expire_after > MAX_EXPIRE_AFTER {
            return Err(format!(
                "table {name:?}: expire_after must be from 0 (never) to {MAX_EXPIRE_AFTER} \
                 steps, got {}",
                self.expire_after
            ));
        }
        if self.admit_after > MAX_ADMIT_AFTER {
            return Err(format!(
                "table {name:?}: admit_after must be from 0 (at once) to {MAX_ADMIT_AFTER} \
                 occurrences, got {}",
                self.admit_after
            ));
        }
        if self.dim == 0 || self.dim > MAX_DIM {
            return Err(format!(
                "table {name:?}: dim must be from 1 to {MAX_DIM}, got {}",
                self.dim
            ));
        }
        let finite = |what: &str, v: f32| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(format!("table {name:?}: {what} must be finite, got {v}"))
            }
        };
        match self.optimizer {
            Optimizer::Sgd { lr } => finite("lr", lr)?,
            Optimizer::AdaGrad {
                lr,
                eps,
                initial_accumulator,
            } => {
                finite("lr", lr)?;
                finite("eps", eps)?;
                finite("initial_accumulator", initial_accumulator)?;
                if initial_accumulator < 0.0 || eps < 0.0 {
                    return Err(format!(
                        "table {name:?}: eps and initial_accumulator must be >= 0"
                    ));
                }
            }
            Optimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => {
                finite("lr", lr)?;
                finite("eps", eps)?;
                if !(0.0..1.0).contains(&beta1) || !(0.0..1.0).contains(&beta2) {
                    return Err(format!(
                        "table {name:?}: betas must be in [0, 1), got ({beta1}, {beta2})"
                    ));
                }
            }
        }
        match self.init {
            Init::Zeros => Ok(()),
            Init::Uniform { low, high } => {
                finite("the uniform initializer's low", low)?;
                finite("the uniform initializer's high", high)?;
                if low > high {
                    return Err(format!(
                        "table {name:?}: uniform({low}, {high}) has low above high"
                    ));
                }
                Ok(())
            }
            Init::Normal { std } => {
                finite("the normal initializer's std", std)?;
                if std < 0.0 {
                    return Err(format!("table {name:?}: std must be >= 0, got {std}"));
                }
                Ok(())
            }
        }
    }

    /// Words per row in the store: the key (2), the values, the state,
    /// and with expiry the table step of the row's last push (1).
    pub fn stride(&self) -> usize {
        let dim = self.dim as usize;
        2 + dim + self.optimizer.state_words(dim) + usize::from(self.expire_after > 0)
    }
}

impl fmt::Display for Init {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Init::Zeros => write!(f, "zeros"),
            Init::Uniform { low, high } => write!(f, "uniform({low}, {high})"),
            Init::Normal { std } => write!(f, "normal(std={std})"),
        }
    }
}

impl fmt::Display for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Optimizer::Sgd { lr } => write!(f, "SGD(lr={lr})"),
            Optimizer::AdaGrad {
                lr,
                eps,
                initial_accumulator,
            } => write!(
                f,
                "RowWiseAdaGrad(lr={lr}, eps={eps}, initial_accumulator={initial_accumulator})"
            ),
            Optimizer::Adam {
                lr,
                beta1,
                beta2,
                eps,
            } => write!(
                f,
                "RowWiseAdam(lr={lr}, betas=({beta1}, {beta2}), eps={eps})"
            ),
        }
    }
}

impl fmt::Display for TableConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "dim {}, init {}, seed {}, optimizer {}",
            self.dim, self.init, self.seed, self.optimizer
        )?;
        if self.expire_after > 0 {
            write!(f, ", expire_after {}", self.expire_after)?;
        }
        if self.admit_after > 1 {
            write!(f, ", admit_after {}", self.admit_after)?;
        }
        Ok(())
    }
}
