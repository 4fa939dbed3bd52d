//! A response as the checkers read it: the members they look at, borrowed
//! from the frame, each read the way `serde_json::Value` would read it
//! (`get`, `as_bool`, `as_u64`, `as_str`) without building the tree. A read
//! answer's data, kilobytes of base64, is then copied once (decoded), not
//! three times. Messages still show the response as `Value` prints it.

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;

/// A member as `Value::get` sees it: absent, or present with any value,
/// null included (serde's `Option` would take a null for absent).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Member<'a>(Option<&'a RawValue>);

impl<'de: 'a, 'a> Deserialize<'de> for Member<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(|raw| Member(Some(raw)))
    }
}

impl<'a> Member<'a> {
    fn text(self) -> Option<&'a str> {
        self.0.map(RawValue::get)
    }

    pub fn is_absent_or_null(self) -> bool {
        matches!(self.text(), None | Some("null"))
    }

    pub fn as_bool(self) -> Option<bool> {
        match self.text()? {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        }
    }

    /// As `Value::as_u64`: a number written as a non-negative integer that
    /// fits (serde_json reads anything else as negative or a float).
    pub fn as_u64(self) -> Option<u64> {
        let t = self.text()?;
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        t.parse().ok()
    }

    pub fn as_str(self) -> Option<Cow<'a, str>> {
        let t = self.text()?;
        if !t.starts_with('"') {
            return None;
        }
        match serde_json::from_str::<&'a str>(t) {
            Ok(s) => Some(Cow::Borrowed(s)),
            // Escapes: the string is not the bytes of the frame.
            Err(_) => serde_json::from_str::<String>(t).ok().map(Cow::Owned),
        }
    }

    /// The member's object, its members of interest read; an absent member,
    /// or one that is not an object, has none of them.
    fn object<T: Deserialize<'a> + Default>(self) -> T {
        match self.text() {
            Some(t) if t.starts_with('{') => serde_json::from_str(t).unwrap_or_default(),
            _ => T::default(),
        }
    }
}

#[derive(Deserialize, Default)]
struct Top<'a> {
    #[serde(borrow, default)]
    id: Member<'a>,
    #[serde(borrow, default)]
    ok: Member<'a>,
    #[serde(borrow, default)]
    error: Member<'a>,
    #[serde(borrow, default)]
    result: Member<'a>,
}

#[derive(Deserialize, Default)]
struct ErrorPart<'a> {
    #[serde(borrow, default)]
    code: Member<'a>,
    #[serde(borrow, default)]
    message: Member<'a>,
}

/// The members of a `result` the checkers read.
#[derive(Deserialize, Default, Debug, Clone, Copy)]
pub(super) struct ResultPart<'a> {
    #[serde(borrow, default)]
    pub handle: Member<'a>,
    #[serde(borrow, default)]
    pub data: Member<'a>,
    #[serde(borrow, default)]
    pub eof: Member<'a>,
    #[serde(borrow, default)]
    pub written: Member<'a>,
}

/// A response's `id`, as the checkers tell them apart.
pub(super) enum Id<'a> {
    Str(Cow<'a, str>),
    /// Absent or null: the answer to a frame with no readable id.
    None,
    /// Anything else: a shape violation.
    Other,
}

pub(super) struct Response<'a> {
    payload: &'a [u8],
    top: Top<'a>,
    error: ErrorPart<'a>,
}

impl<'a> Response<'a> {
    /// `Err` holds what a violation says: not JSON (serde_json's words), or
    /// JSON whose shape no reading can make sense of.
    pub fn parse(payload: &'a [u8]) -> Result<Self, String> {
        match serde_json::from_slice::<Top<'a>>(payload) {
            Ok(top) => {
                let error = top.error.object();
                Ok(Response { payload, top, error })
            }
            Err(_) => match serde_json::from_slice::<Value>(payload) {
                Err(e) => Err(format!("response is not JSON: {e}")),
                Ok(v) => Err(format!("{v}")),
            },
        }
    }

    pub fn ok(&self) -> Option<bool> {
        self.top.ok.as_bool()
    }

    pub fn code(&self) -> Cow<'a, str> {
        self.error.code.as_str().unwrap_or_default()
    }

    pub fn message(&self) -> Cow<'a, str> {
        self.error.message.as_str().unwrap_or_default()
    }

    pub fn id(&self) -> Id<'a> {
        if self.top.id.is_absent_or_null() {
            return Id::None;
        }
        self.top.id.as_str().map_or(Id::Other, Id::Str)
    }

    /// `None` when there is no `result` member at all.
    pub fn result(&self) -> Option<ResultPart<'a>> {
        self.top.result.0.map(|_| self.top.result.object())
    }

    /// The whole response as a tree, for the checkers that read more.
    pub fn value(&self) -> Value {
        serde_json::from_slice(self.payload).unwrap_or(Value::Null)
    }
}

/// As `Value` prints it, so messages read as they always did.
impl fmt::Display for Response<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every reading, done on a `Value` as the checkers did before.
    fn by_value(v: &Value) -> (Option<bool>, String, String, Option<Option<String>>, Option<ResultByValue>) {
        let id = match v.get("id") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(Some(s.clone())),
            Some(_) => Some(None),
        };
        let result = v.get("result").map(|r| ResultByValue {
            handle: r.get("handle").and_then(Value::as_u64),
            data: r.get("data").and_then(Value::as_str).map(str::to_owned),
            eof: r.get("eof").and_then(Value::as_bool),
            written: r.get("written").and_then(Value::as_u64),
        });
        (
            v.get("ok").and_then(Value::as_bool),
            v.get("error").and_then(|e| e.get("code")).and_then(Value::as_str).unwrap_or("").to_owned(),
            v.get("error").and_then(|e| e.get("message")).and_then(Value::as_str).unwrap_or("").to_owned(),
            id,
            result,
        )
    }

    #[derive(Debug, PartialEq)]
    struct ResultByValue {
        handle: Option<u64>,
        data: Option<String>,
        eof: Option<bool>,
        written: Option<u64>,
    }

    fn by_view(
        r: &Response,
    ) -> (Option<bool>, String, String, Option<Option<String>>, Option<ResultByValue>) {
        let id = match r.id() {
            Id::None => None,
            Id::Str(s) => Some(Some(s.into_owned())),
            Id::Other => Some(None),
        };
        let result = r.result().map(|p| ResultByValue {
            handle: p.handle.as_u64(),
            data: p.data.as_str().map(Cow::into_owned),
            eof: p.eof.as_bool(),
            written: p.written.as_u64(),
        });
        (r.ok(), r.code().into_owned(), r.message().into_owned(), id, result)
    }

    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            "\\PC{0,8}".prop_map(Value::from),
            "[a-z\"\\\\\n]{0,8}".prop_map(Value::from),
        ]
    }

    fn member(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
        prop_oneof![
            scalar(),
            proptest::collection::btree_map(proptest::sample::select(keys), scalar(), 0..4)
                .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
        ]
    }

    fn response() -> impl Strategy<Value = Value> {
        prop_oneof![
            1 => scalar(),
            8 => (
                proptest::option::of(scalar()),
                proptest::option::of(scalar()),
                proptest::option::of(member(&["code", "message", "x"])),
                proptest::option::of(member(&["handle", "data", "eof", "written", "y"])),
            )
                .prop_map(|(id, ok, error, result)| {
                    let mut m = serde_json::Map::new();
                    for (k, v) in [("id", id), ("ok", ok), ("error", error), ("result", result)] {
                        if let Some(v) = v {
                            m.insert(k.to_owned(), v);
                        }
                    }
                    Value::Object(m)
                }),
        ]
    }

    proptest! {
        /// The view reads every member as `Value` does, or refuses the
        /// response as a shape the checkers would refuse too.
        #[test]
        fn the_view_reads_what_value_reads(v in response()) {
            let bytes = serde_json::to_vec(&v).unwrap();
            // What the checkers saw: the bytes parsed (a float may not
            // come back the same).
            let v: Value = serde_json::from_slice(&bytes).unwrap();
            match Response::parse(&bytes) {
                Ok(r) => {
                    prop_assert_eq!(by_view(&r), by_value(&v));
                    prop_assert_eq!(r.to_string(), v.to_string());
                }
                Err(msg) => {
                    prop_assert!(!v.is_object(), "an object refused: {}", v);
                    prop_assert_eq!(msg, v.to_string());
                }
            }
        }

        #[test]
        fn bytes_that_are_not_json_are_named_as_value_names_them(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Err(e) = serde_json::from_slice::<Value>(&bytes) {
                prop_assert_eq!(Response::parse(&bytes).err(), Some(format!("response is not JSON: {e}")));
            }
        }
    }

    #[test]
    fn a_null_member_is_present_and_an_escaped_string_is_read() {
        let r = Response::parse(br#"{"id":"a\"b","ok":true,"result":null}"#).unwrap();
        assert!(matches!(r.id(), Id::Str(s) if s == "a\"b"));
        let p = r.result().expect("a null result is a result");
        assert_eq!(p.data.as_str(), None);
        assert!(Response::parse(br#"{"ok":true}"#).unwrap().result().is_none());
    }
}
