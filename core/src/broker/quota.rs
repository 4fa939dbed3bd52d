//! Money, usage and the two formulas of seed 002: the quota charge and the
//! soft trim of `max_tokens`.
//!
//! Everything is exact integer arithmetic. Prices have at most six decimal
//! places in USD per 1M tokens, so a price is an integer number of
//! micro-USD per 1M tokens, and `tokens × price / 1_000_000` USD is exactly
//! `tokens × price_micros` pico-USD. Holding the quota in pico-USD therefore
//! makes every charge exact: the quota invariant ("remaining equals the
//! initial amount minus the sum of the deltas") can be checked with `==`,
//! and a session of a million calls drifts by nothing, where `f64` would
//! drift by a rounding error per call.

use super::pricing::{Price, Weights};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// An amount of money, in pico-USD (10⁻¹² USD). A `u64` holds up to about
/// 18 million USD, far above any session budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Money(u64);

impl Money {
    pub const ZERO: Money = Money(0);
    pub const PICO_PER_USD: u64 = 1_000_000_000_000;

    pub const fn from_pico(pico: u64) -> Self {
        Money(pico)
    }

    pub const fn as_pico(self) -> u64 {
        self.0
    }

    /// An amount given as a decimal string of USD (`"5"`, `"0.0100"`,
    /// `"2.5e-3"`), exactly; `None` when it is negative, finer than a
    /// pico-USD or too large.
    pub fn from_usd_str(text: &str) -> Option<Self> {
        parse_decimal_scaled(text, 12).ok().map(Money)
    }

    /// An amount given as an `f64` of USD, rounded to the nearest pico-USD.
    /// Prefer [`Money::from_usd_str`] where the text is at hand.
    pub fn from_usd_f64(usd: f64) -> Option<Self> {
        let pico = usd * Self::PICO_PER_USD as f64;
        // `u64::MAX as f64` rounds up to 2^64, which is itself out of range.
        (pico.is_finite() && pico >= 0.0 && pico < u64::MAX as f64).then(|| Money(pico.round() as u64))
    }

    /// For display and for the wire's `remaining_units`; never for
    /// accounting.
    pub fn as_usd_f64(self) -> f64 {
        self.0 as f64 / Self::PICO_PER_USD as f64
    }

    pub const fn saturating_sub(self, other: Money) -> Money {
        Money(self.0.saturating_sub(other.0))
    }
}

impl fmt::Display for Money {
    /// Exact: `0.010000000000 USD`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:012} USD", self.0 / Self::PICO_PER_USD, self.0 % Self::PICO_PER_USD)
    }
}

/// Why a decimal could not be read exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecimalError {
    Malformed,
    Negative,
    /// More decimal places than the scale keeps.
    TooPrecise,
    TooLarge,
}

impl fmt::Display for DecimalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DecimalError::Malformed => "not a decimal number",
            DecimalError::Negative => "negative",
            DecimalError::TooPrecise => "too many decimal places",
            DecimalError::TooLarge => "too large",
        })
    }
}

/// `text × 10^scale` as an integer, exactly, or an error when that is not
/// an integer in `u64`. Accepts what JSON numbers look like, exponent
/// included, since `serde_json` prints an `f64` such as `1e-7` that way.
pub(crate) fn parse_decimal_scaled(text: &str, scale: u32) -> Result<u64, DecimalError> {
    let text = text.trim();
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (mantissa, exp) = match text.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().map_err(|_| DecimalError::Malformed)?),
        None => (text, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if int_part.len() + frac_part.len() == 0 || !all_digits(int_part) || !all_digits(frac_part) {
        return Err(DecimalError::Malformed);
    }
    let digits = format!("{int_part}{frac_part}");
    let digits = digits.trim_start_matches('0');
    let significant = digits.trim_end_matches('0');
    if significant.is_empty() {
        return Ok(0);
    }
    if negative {
        return Err(DecimalError::Negative);
    }
    // value = significant × 10^shift
    let stripped = (digits.len() - significant.len()) as i64;
    let shift = i64::from(scale) + i64::from(exp) - frac_part.len() as i64 + stripped;
    if shift < 0 {
        return Err(DecimalError::TooPrecise);
    }
    if significant.len() > 20 || shift > 20 {
        return Err(DecimalError::TooLarge);
    }
    let mut value: u128 = 0;
    for b in significant.bytes() {
        value = value * 10 + u128::from(b - b'0');
    }
    let value = value.checked_mul(10u128.pow(shift as u32)).ok_or(DecimalError::TooLarge)?;
    u64::try_from(value).map_err(|_| DecimalError::TooLarge)
}

/// Token counts as the provider reported them. `prompt_tokens` includes
/// the cached ones, as in OpenAI-compatible APIs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Why a provider's usage object could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad usage: {}", self.0)
    }
}

impl Usage {
    /// Read an OpenAI-style `usage` object: `prompt_tokens`,
    /// `completion_tokens`, `total_tokens` and
    /// `prompt_tokens_details.cached_tokens` (or a top-level
    /// `cached_tokens`, the seed's own shape). Absent counts are zero; a
    /// count that is present must be a non-negative integer. Cached tokens
    /// beyond the prompt are capped to it, so no token is charged twice.
    pub fn from_openai(usage: &Value) -> Result<Usage, UsageError> {
        let Value::Object(obj) = usage else {
            return Err(UsageError(format!("not an object: {usage}")));
        };
        let count = |v: Option<&Value>, name: &str| -> Result<Option<u64>, UsageError> {
            match v {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .map(Some)
                    .ok_or_else(|| UsageError(format!("{name} is not a token count: {v}"))),
            }
        };
        let prompt = count(obj.get("prompt_tokens"), "prompt_tokens")?;
        let completion = count(obj.get("completion_tokens"), "completion_tokens")?;
        if prompt.is_none() && completion.is_none() {
            return Err(UsageError("neither prompt_tokens nor completion_tokens".into()));
        }
        let (prompt, completion) = (prompt.unwrap_or(0), completion.unwrap_or(0));
        let nested = usage.pointer("/prompt_tokens_details/cached_tokens");
        let cached = match count(nested, "prompt_tokens_details.cached_tokens")? {
            Some(c) => c,
            None => count(obj.get("cached_tokens"), "cached_tokens")?.unwrap_or(0),
        };
        let total =
            count(obj.get("total_tokens"), "total_tokens")?.unwrap_or(prompt.saturating_add(completion));
        Ok(Usage {
            prompt_tokens: prompt,
            cached_tokens: cached.min(prompt),
            completion_tokens: completion,
            total_tokens: total,
        })
    }
}

/// The seed's `delta_units`, exactly: uncached prompt tokens at the input
/// price, cached ones at the cached price, completion tokens at the output
/// price.
pub fn charge(usage: &Usage, weights: &Weights) -> Money {
    let cached = usage.cached_tokens.min(usage.prompt_tokens);
    let uncached = usage.prompt_tokens - cached;
    let term = |tokens: u64, price: Price| u128::from(tokens) * u128::from(price.micros());
    let pico = term(uncached, weights.input)
        + term(cached, weights.cached)
        + term(usage.completion_tokens, weights.output);
    Money(u64::try_from(pico).unwrap_or(u64::MAX))
}

/// A safety factor as parts per million, so the trim is exact too.
pub(crate) fn factor_ppm(factor: f64) -> u64 {
    (factor * 1_000_000.0).round() as u64
}

/// `floor(remaining / output_price × 1_000_000 × safety_factor)` tokens:
/// the completion the remaining quota still pays for, with a margin.
/// `None` when output is free, so nothing bounds it.
pub fn safe_output_tokens(remaining: Money, output: Price, safety_ppm: u64) -> Option<u64> {
    if output.micros() == 0 {
        return None;
    }
    // remaining_pico / price_micros is the affordable token count exactly;
    // the factor in ppm brings one more 10^6 into the divisor.
    let num = u128::from(remaining.as_pico()) * u128::from(safety_ppm);
    let den = u128::from(output.micros()) * 1_000_000;
    Some(u64::try_from(num / den).unwrap_or(u64::MAX))
}

/// The outcome of the soft trim for one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Trim {
    /// What the caller asked for, or the configured default.
    pub requested: u32,
    pub effective: u32,
    pub trim_applied: bool,
    /// The quota could not pay even the floor, which was allowed anyway
    /// (the seed: "still allow minimal completion and warn").
    pub floor_applied: bool,
}

/// `effective = min(requested, max(safe_out, floor))`: the trim never
/// raises what was asked and never cuts below the floor.
pub fn soft_trim(requested: u32, safe_out: Option<u64>, floor: u32) -> Trim {
    let Some(safe) = safe_out else {
        return Trim { requested, effective: requested, trim_applied: false, floor_applied: false };
    };
    let cap = safe.max(u64::from(floor));
    let effective = u32::try_from(u64::from(requested).min(cap)).unwrap_or(requested);
    Trim {
        requested,
        effective,
        trim_applied: effective < requested,
        floor_applied: safe < u64::from(floor) && safe < u64::from(requested),
    }
}

/// An upper bound on the prompt tokens of a request whose messages and
/// tools are `bytes` bytes of JSON text: one token per byte. Tokenizers of
/// current models are byte-level BPE, where every token covers at least
/// one byte, and the JSON around each message (`{"role":…,"content":…}`,
/// at least 28 bytes) outweighs the few tokens a chat template adds per
/// message. About four times what English text really costs: a bound to
/// refuse on, never a forecast.
pub fn prompt_token_bound(bytes: u64) -> u64 {
    bytes
}

/// [`prompt_token_bound`] plus `media_tokens` for each of `media_parts`
/// (an image, audio, a file: its cost does not follow from its length);
/// `None` when there are media parts and no stated bound for them.
pub fn prompt_token_bound_with_media(bytes: u64, media_parts: u32, media_tokens: Option<u32>) -> Option<u64> {
    if media_parts == 0 {
        return Some(prompt_token_bound(bytes));
    }
    let per = u64::from(media_tokens?);
    Some(prompt_token_bound(bytes).saturating_add(per.saturating_mul(u64::from(media_parts))))
}

/// Under `enforce_budget`: whether a call fits in `available`, and how.
/// Its worst case is `prompt_tokens` at the dearer of the input and cached
/// prices plus its completion at the output price. The completion is cut
/// to what is left after the prompt (never below
/// `min(max_tokens, min_output)`, and never to zero); `None` when not even
/// that fits. Returns the `max_tokens` to send and the worst-case cost.
pub fn fit_budget(
    available: Money,
    prompt_tokens: u64,
    max_tokens: u32,
    min_output: u32,
    weights: &Weights,
) -> Option<(u32, Money)> {
    let input = u128::from(weights.input.micros().max(weights.cached.micros()));
    let prompt_cost = u128::from(prompt_tokens) * input;
    let left = u128::from(available.as_pico()).checked_sub(prompt_cost)?;
    let output = u128::from(weights.output.micros());
    // Free output: any completion fits.
    let effective = match left.checked_div(output) {
        None => max_tokens,
        Some(affordable) => {
            let floor = u128::from(max_tokens.min(min_output).max(1));
            if affordable < floor {
                return None;
            }
            u32::try_from(affordable.min(u128::from(max_tokens))).unwrap_or(max_tokens)
        }
    };
    let cost = prompt_cost + u128::from(effective) * output;
    Some((effective, Money(u64::try_from(cost).unwrap_or(u64::MAX))))
}
