//! The pricing catalog: model → weights, in USD per 1M tokens.
//!
//! Config-first: the shell loads a JSON file when one is configured and
//! falls back to [`PricingCatalog::builtin`], which is the sample shipped
//! as `core/pricing.sample.json` (linked from `docs/`), inside the crate
//! so `airlock-core` builds from its own package.

use super::quota::{parse_decimal_scaled, DecimalError};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt;

/// The catalog compiled in: the sample file, verbatim.
pub const SAMPLE_CATALOG_JSON: &str = include_str!("../../pricing.sample.json");

/// A price in USD per 1M tokens, held as an integer number of micro-USD
/// per 1M tokens (six decimal places, exactly). On the wire and in traces
/// it is the USD number, as in the catalog file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Price(u64);

impl Price {
    pub const fn from_micros(micros: u64) -> Self {
        Price(micros)
    }

    pub const fn micros(self) -> u64 {
        self.0
    }

    /// Exactly, from a decimal such as `"0.075"`.
    pub fn parse(text: &str) -> Result<Self, DecimalError> {
        parse_decimal_scaled(text, 6).map(Price)
    }

    pub fn as_f64(self) -> f64 {
        self.0 as f64 / 1_000_000.0
    }
}

impl Serialize for Price {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // k / 10^6 correctly rounded prints back as the same six-decimal
        // number, so this round-trips exactly through `Price::parse`.
        s.serialize_f64(self.as_f64())
    }
}

impl<'de> Deserialize<'de> for Price {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = serde_json::Number::deserialize(d)?;
        Price::parse(&n.to_string()).map_err(|e| serde::de::Error::custom(format!("price {n}: {e}")))
    }
}

/// The request field a model takes its output bound in. OpenAI's o-series
/// and gpt-5 refuse `max_tokens` and want `max_completion_tokens`; most
/// compatible servers know only `max_tokens`, hence the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensField {
    #[default]
    MaxTokens,
    MaxCompletionTokens,
}

impl MaxTokensField {
    pub const fn as_str(self) -> &'static str {
        match self {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
        }
    }

    fn is_default(&self) -> bool {
        *self == MaxTokensField::MaxTokens
    }
}

/// What one model costs, per 1M tokens, and (kept with its prices so one
/// catalog entry describes a model) how its output bound is named.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Weights {
    pub input: Price,
    pub cached: Price,
    pub output: Price,
    #[serde(default, skip_serializing_if = "MaxTokensField::is_default")]
    pub max_tokens_field: MaxTokensField,
    /// The stated bound, in prompt tokens, of one media part (an image,
    /// audio, a file: see `wire::media_parts`), whose cost does not
    /// follow from its length. Without one, `enforce_budget` refuses
    /// calls that hold such parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_tokens: Option<u32>,
}

/// Why a catalog could not be loaded. Every variant names what is wrong
/// and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CatalogError {
    NotJson(String),
    NotAnObject,
    Empty,
    ModelNotAnObject { model: String },
    MissingPrice { model: String, key: &'static str },
    UnknownKey { model: String, key: String },
    BadPrice { model: String, key: String, value: String, why: String },
    BadMaxTokensField { model: String, value: String },
    BadMediaTokens { model: String, value: String },
}

impl fmt::Display for CatalogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CatalogError::NotJson(e) => write!(f, "pricing catalog is not JSON: {e}"),
            CatalogError::NotAnObject => f.write_str("pricing catalog is not a JSON object of models"),
            CatalogError::Empty => f.write_str("pricing catalog names no model"),
            CatalogError::ModelNotAnObject { model } => {
                write!(f, "pricing for model {model:?} is not an object")
            }
            CatalogError::MissingPrice { model, key } => write!(f, "model {model:?} has no {key:?} price"),
            CatalogError::UnknownKey { model, key } => {
                write!(
                    f,
                    "model {model:?}: unknown key {key:?} (want input, cached, output, max_tokens_field, media_tokens)"
                )
            }
            CatalogError::BadMaxTokensField { model, value } => write!(
                f,
                "model {model:?}: max_tokens_field {value} is not \"max_tokens\" or \"max_completion_tokens\""
            ),
            CatalogError::BadMediaTokens { model, value } => write!(
                f,
                "model {model:?}: media_tokens {value} is not a whole number of tokens (at most 4294967295)"
            ),
            CatalogError::BadPrice { model, key, value, why } => {
                write!(f, "model {model:?}: {key} price {value} is {why} (want USD per 1M tokens, at most 6 decimals)")
            }
        }
    }
}

impl std::error::Error for CatalogError {}

/// Model name → weights.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PricingCatalog {
    models: BTreeMap<String, Weights>,
}

impl PricingCatalog {
    /// Parse `{"model": {"input": 0.15, "cached": 0.075, "output": 0.6}}`,
    /// each entry optionally with `"max_tokens_field": "max_completion_tokens"`
    /// (see [`MaxTokensField`]; `max_tokens` when absent) and
    /// `"media_tokens": N` (see [`Weights::media_tokens`]).
    /// `cached` may be left out for a model without a cache discount: it
    /// then costs the input price, which never undercharges.
    pub fn from_json(text: &str) -> Result<Self, CatalogError> {
        let value: Value = serde_json::from_str(text).map_err(|e| CatalogError::NotJson(e.to_string()))?;
        let Value::Object(models) = value else { return Err(CatalogError::NotAnObject) };
        let mut catalog = PricingCatalog::default();
        for (model, prices) in models {
            let Value::Object(prices) = prices else { return Err(CatalogError::ModelNotAnObject { model }) };
            let weights = parse_weights(&model, &prices)?;
            catalog.models.insert(model, weights);
        }
        if catalog.models.is_empty() {
            return Err(CatalogError::Empty);
        }
        Ok(catalog)
    }

    /// The sample catalog shipped with airlock (`docs/pricing.sample.json`).
    pub fn builtin() -> Self {
        // Checked by a unit test, so this cannot fail in a release.
        Self::from_json(SAMPLE_CATALOG_JSON).unwrap_or_default()
    }

    pub fn get(&self, model: &str) -> Option<&Weights> {
        self.models.get(model)
    }

    pub fn insert(&mut self, model: impl Into<String>, weights: Weights) {
        self.models.insert(model.into(), weights);
    }

    pub fn models(&self) -> impl Iterator<Item = (&str, &Weights)> {
        self.models.iter().map(|(m, w)| (m.as_str(), w))
    }
}

fn parse_weights(model: &str, prices: &Map<String, Value>) -> Result<Weights, CatalogError> {
    let known = |k: &str| matches!(k, "input" | "cached" | "output" | "max_tokens_field" | "media_tokens");
    if let Some(key) = prices.keys().find(|k| !known(k)) {
        return Err(CatalogError::UnknownKey { model: model.into(), key: key.clone() });
    }
    let price = |key: &'static str| -> Result<Option<Price>, CatalogError> {
        let Some(v) = prices.get(key) else { return Ok(None) };
        let bad = |why: String| CatalogError::BadPrice {
            model: model.into(),
            key: key.into(),
            value: v.to_string(),
            why,
        };
        match v {
            Value::Number(n) => Price::parse(&n.to_string()).map(Some).map_err(|e| bad(e.to_string())),
            _ => Err(bad("not a number".into())),
        }
    };
    let missing = |key| CatalogError::MissingPrice { model: model.into(), key };
    let input = price("input")?.ok_or_else(|| missing("input"))?;
    let output = price("output")?.ok_or_else(|| missing("output"))?;
    let cached = price("cached")?.unwrap_or(input);
    let max_tokens_field = match prices.get("max_tokens_field") {
        None => MaxTokensField::default(),
        Some(Value::String(s)) if s == "max_tokens" => MaxTokensField::MaxTokens,
        Some(Value::String(s)) if s == "max_completion_tokens" => MaxTokensField::MaxCompletionTokens,
        Some(v) => return Err(CatalogError::BadMaxTokensField { model: model.into(), value: v.to_string() }),
    };
    let media_tokens = match prices.get("media_tokens") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| CatalogError::BadMediaTokens { model: model.into(), value: v.to_string() })?,
        ),
    };
    Ok(Weights { input, cached, output, max_tokens_field, media_tokens })
}
