//! JSON held as text.
//!
//! A parsed `serde_json::Value` costs about fifty times the bytes of the
//! text it came from (a map node per object, a `Value` per element), so
//! what the broker keeps for a while — queued requests, provider replies
//! on their way to a child — is kept as compact, validated JSON text
//! instead ([`RawJson`]). Text is read into it by a streaming transcoder
//! that never builds a tree: it copies values through, in their order,
//! counting them against [`ReadLimits`] and passing every decoded string
//! (keys included) through a [`Redactor`] when one is given.

use super::secret::Redactor;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;
use std::fmt;

/// Values a provider reply may hold (every array element, object key and
/// value counts): a reply of this many small values still fits the body
/// cap, and a real completion holds a few hundred.
pub const DEFAULT_MAX_REPLY_VALUES: usize = 1 << 20;
/// Nesting a provider reply may have.
pub const DEFAULT_MAX_REPLY_DEPTH: usize = 64;

/// Bounds on what the transcoder reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimits {
    pub max_values: usize,
    pub max_depth: usize,
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits { max_values: DEFAULT_MAX_REPLY_VALUES, max_depth: DEFAULT_MAX_REPLY_DEPTH }
    }
}

impl ReadLimits {
    /// No bound beyond the parser's own recursion limit: for text airlock
    /// wrote itself (traces).
    pub const UNBOUNDED: ReadLimits = ReadLimits { max_values: usize::MAX, max_depth: usize::MAX };
}

/// Compact, valid JSON text. Serializes as the JSON it holds (not as a
/// string), so it reads in a trace exactly as a `Value` would.
#[derive(Clone)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// The canonical text of `v` (compact, keys in `Map` order).
    pub fn from_value(v: &Value) -> Self {
        // A `Value` always serializes, and to valid JSON: the text is not
        // read back to check it (a message's kilobytes were parsed twice).
        serde_json::value::to_raw_value(v).map(RawJson).unwrap_or_else(|_| RawJson::null())
    }

    /// `text`, checked to be one JSON value (kept as it is).
    pub fn from_text(text: String) -> Result<Self, String> {
        RawValue::from_string(text).map(RawJson).map_err(|e| format!("not JSON: {e}"))
    }

    fn null() -> Self {
        // "null" is valid JSON.
        RawJson(RawValue::from_string("null".into()).unwrap_or_else(|_| unreachable!()))
    }

    /// Read `text` as JSON, re-encoded compactly in its own order, within
    /// `limits`, with every decoded string scrubbed by `redactor`.
    pub fn read(text: &str, limits: ReadLimits, redactor: Option<&Redactor>) -> Result<Self, String> {
        Self::read_counted(text, limits, redactor).map(|(r, _)| r)
    }

    /// [`RawJson::read`], also saying how many values were read.
    pub fn read_counted(
        text: &str,
        limits: ReadLimits,
        redactor: Option<&Redactor>,
    ) -> Result<(Self, usize), String> {
        let mut sink = Sink { out: Vec::with_capacity(text.len().min(1 << 20)), values: 0, limits, redactor };
        let mut de = serde_json::Deserializer::from_str(text);
        Seed { sink: &mut sink, depth: 0 }.deserialize(&mut de).map_err(|e| e.to_string())?;
        de.end().map_err(|e| e.to_string())?;
        let values = sink.values;
        sink.finish().map(|r| (r, values))
    }

    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// Bytes of text held.
    pub fn len(&self) -> usize {
        self.as_str().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Parse into a tree (tests, checkers, small values only).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.as_str()).unwrap_or(Value::Null)
    }

    /// The text of an array with `first` put in front of this one's
    /// elements; `None` when this is not an array.
    pub fn prepend(&self, first: &Value) -> Option<RawJson> {
        let inner = self.as_str().strip_prefix('[')?.strip_suffix(']')?;
        let head = serde_json::to_string(first).ok()?;
        let text = if inner.trim().is_empty() { format!("[{head}]") } else { format!("[{head},{inner}]") };
        RawJson::from_text(text).ok()
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for RawJson {}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    /// Through the transcoder rather than `RawValue`, so it also works
    /// inside internally tagged enums (which buffer their content).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut sink = Sink { out: Vec::new(), values: 0, limits: ReadLimits::UNBOUNDED, redactor: None };
        Seed { sink: &mut sink, depth: 0 }.deserialize(d)?;
        sink.finish().map_err(de::Error::custom)
    }
}

struct Sink<'r> {
    out: Vec<u8>,
    values: usize,
    limits: ReadLimits,
    redactor: Option<&'r Redactor>,
}

impl Sink<'_> {
    fn count<E: de::Error>(&mut self) -> Result<(), E> {
        self.values += 1;
        if self.values > self.limits.max_values {
            return Err(E::custom(format!("more than {} JSON values", self.limits.max_values)));
        }
        Ok(())
    }

    fn json<T: Serialize + ?Sized, E: de::Error>(&mut self, v: &T) -> Result<(), E> {
        serde_json::to_writer(&mut self.out, v).map_err(E::custom)
    }

    fn string<E: de::Error>(&mut self, s: &str) -> Result<(), E> {
        self.count()?;
        match self.redactor {
            Some(r) => {
                let s = r.scrub(s);
                self.json(s.as_ref())
            }
            None => self.json(s),
        }
    }

    fn finish(self) -> Result<RawJson, String> {
        let text = String::from_utf8(self.out).map_err(|e| e.to_string())?;
        RawJson::from_text(text)
    }
}

struct Seed<'s, 'r> {
    sink: &'s mut Sink<'r>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Seed<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl Seed<'_, '_> {
    fn enter<E: de::Error>(&mut self) -> Result<usize, E> {
        self.sink.count()?;
        let depth = self.depth + 1;
        if depth > self.sink.limits.max_depth {
            return Err(E::custom(format!("nested deeper than {}", self.sink.limits.max_depth)));
        }
        Ok(depth)
    }
}

impl<'de> Visitor<'de> for Seed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.sink.count()?;
        self.sink.json(&v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.sink.count()?;
        self.sink.json(&v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.sink.count()?;
        self.sink.json(&v)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.sink.count()?;
        self.sink.json(&v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.sink.string(v)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.sink.count()?;
        self.sink.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        let depth = self.enter()?;
        self.sink.out.push(b'[');
        let mut first = true;
        loop {
            if !first {
                self.sink.out.push(b',');
            }
            if seq.next_element_seed(Seed { sink: self.sink, depth })?.is_none() {
                if !first {
                    self.sink.out.pop();
                }
                break;
            }
            first = false;
        }
        self.sink.out.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let depth = self.enter()?;
        self.sink.out.push(b'{');
        let mut first = true;
        loop {
            if !first {
                self.sink.out.push(b',');
            }
            if map.next_key_seed(Key { sink: self.sink })?.is_none() {
                if !first {
                    self.sink.out.pop();
                }
                break;
            }
            self.sink.out.push(b':');
            map.next_value_seed(Seed { sink: self.sink, depth })?;
            first = false;
        }
        self.sink.out.push(b'}');
        Ok(())
    }
}

/// An object key: a string, scrubbed like any other.
struct Key<'s, 'r> {
    sink: &'s mut Sink<'r>,
}

impl<'de> DeserializeSeed<'de> for Key<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.sink.string(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn text_is_reencoded_compactly_in_order() {
        let r = RawJson::read(
            r#" { "b" : [1, 2.5, "\u0041", null, true], "a": {} } "#,
            ReadLimits::default(),
            None,
        )
        .unwrap();
        assert_eq!(r.as_str(), r#"{"b":[1,2.5,"A",null,true],"a":{}}"#);
        assert_eq!(RawJson::read("[]", ReadLimits::default(), None).unwrap().as_str(), "[]");
    }

    #[test]
    fn limits_hold() {
        let many = format!("[{}0]", "0,".repeat(100));
        let small = ReadLimits { max_values: 50, max_depth: 4 };
        assert!(RawJson::read(&many, small, None).unwrap_err().contains("more than 50"));
        assert!(RawJson::read("[[[[[1]]]]]", small, None).unwrap_err().contains("deeper than 4"));
        assert!(RawJson::read("[1] x", small, None).is_err());
    }

    #[test]
    fn strings_and_keys_are_scrubbed() {
        let r = Redactor::with_secret("sk-abcdefgh").unwrap();
        let out = RawJson::read(r#"{"sk-abcdefgh":"x \u0073k-abcdefgh"}"#, ReadLimits::default(), Some(&r))
            .unwrap();
        assert_eq!(out.as_str(), r#"{"[redacted]":"x [redacted]"}"#);
    }

    #[test]
    fn serde_round_trip_inside_tagged_enums() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        #[serde(tag = "t")]
        enum E {
            A { m: RawJson },
        }
        let m = RawJson::read(r#"{"z":1,"a":[{"y":2,"b":3}]}"#, ReadLimits::default(), None).unwrap();
        let text = serde_json::to_string(&E::A { m: m.clone() }).unwrap();
        assert_eq!(text, r#"{"t":"A","m":{"z":1,"a":[{"y":2,"b":3}]}}"#);
        let back: E = serde_json::from_str(&text).unwrap();
        assert_eq!(back, E::A { m });
    }

    #[test]
    fn prepend_puts_a_value_first() {
        let m = RawJson::from_value(&json!([{"role": "user"}]));
        assert_eq!(
            m.prepend(&json!({"role": "system"})).unwrap().as_str(),
            r#"[{"role":"system"},{"role":"user"}]"#
        );
        assert_eq!(RawJson::from_value(&json!([])).prepend(&json!(1)).unwrap().as_str(), "[1]");
        assert!(RawJson::from_value(&json!({})).prepend(&json!(1)).is_none());
    }

    proptest! {
        /// Canonical text reads back to itself.
        #[test]
        fn canonical_text_is_a_fixed_point(v in any::<(Vec<u8>, String, Option<i64>, bool)>()) {
            let value = serde_json::to_value(&v).unwrap();
            let canon = RawJson::from_value(&value);
            // The unchecked text is what the checked constructor keeps.
            let checked = RawJson::from_text(serde_json::to_string(&value).unwrap()).unwrap();
            prop_assert_eq!(&canon, &checked);
            let again = RawJson::read(canon.as_str(), ReadLimits::UNBOUNDED, None).unwrap();
            prop_assert_eq!(canon, again);
        }
    }
}
