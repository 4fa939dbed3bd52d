//! A response as the checkers read it: the members they look at, borrowed
//! from the frame, each read the way `serde_json::Value` would read it
//! (`get`, `as_bool`, `as_u64`, `as_str`) without building the tree. A read
//! answer's data, kilobytes of base64, is then copied once (decoded), not
//! three times. Messages still show the response as `Value` prints it.

use serde::de::value::MapAccessDeserializer;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// A member as `Value::get` sees it: absent, or present with any value,
/// null included (serde's `Option` would take a null for absent).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Member<'a>(Option<&'a str>);

impl<'de: 'a, 'a> Deserialize<'de> for Member<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(d).map(|raw| Member(Some(raw.get())))
    }
}

impl<'a> Member<'a> {
    /// The member's JSON text, as the frame spells it.
    fn text(self) -> Option<&'a str> {
        self.0
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
        // A raw value is valid JSON: a string with no escape is the bytes
        // between its quotes (the kilobytes of a read's base64 need not be
        // scanned a second time).
        if !t.contains('\\') {
            return Some(Cow::Borrowed(&t[1..t.len() - 1]));
        }
        // A backslash in a JSON string is always an escape: the string is
        // not the bytes of the frame (and asking serde_json to borrow it
        // would only fail, after formatting why).
        serde_json::from_str::<String>(t).ok().map(Cow::Owned)
    }
}

/// A member read as an object, its members of interest taken in the same
/// pass as the response's (not kept as text and parsed again): absent, or
/// present with those members (none of them when it is not an object).
#[derive(Default)]
struct Nested<T>(Option<T>);

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Nested<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Default> Visitor<'de> for V<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(T::default())
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<T, E> {
                Ok(T::default())
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<T, E> {
                Ok(T::default())
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<T, E> {
                Ok(T::default())
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<T, E> {
                Ok(T::default())
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<T, E> {
                Ok(T::default())
            }
            fn visit_unit<E: de::Error>(self) -> Result<T, E> {
                Ok(T::default())
            }
        }
        d.deserialize_any(V(PhantomData)).map(|t| Nested(Some(t)))
    }
}

#[derive(Deserialize, Default)]
struct Top<'a> {
    #[serde(borrow, default)]
    id: Member<'a>,
    #[serde(borrow, default)]
    ok: Member<'a>,
    #[serde(borrow, default)]
    error: Nested<ErrorPart<'a>>,
    #[serde(borrow, default)]
    result: Nested<ResultPart<'a>>,
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
    /// The pager's answers: a wrap's fd, a page's text.
    #[serde(borrow, default)]
    pub fd: Member<'a>,
    #[serde(borrow, default)]
    pub xml: Member<'a>,
}

/// The answers the proxy writes, read without serde_json: plain members
/// only (`airlock_core::codec::plain`). Anything else, an escape, a float,
/// an unknown or repeated member, declines to serde_json's reading, so the
/// two agree wherever this one answers (property-tested).
mod scan {
    use super::{ErrorPart, Member, Nested, ResultPart, Top};
    use airlock_core::codec::plain::Cursor;

    /// A scalar's JSON text, as the frame spells it.
    fn scalar<'a>(c: &mut Cursor<'a>, payload: &'a [u8]) -> Option<Member<'a>> {
        let start = c.pos();
        match c.peek()? {
            b'"' => drop(c.string()?),
            b't' => c.literal(b"true")?,
            b'f' => c.literal(b"false")?,
            b'n' => c.literal(b"null")?,
            _ => drop(c.uint()?),
        }
        // One UTF-8 check of the string, its quotes included.
        std::str::from_utf8(payload.get(start..c.pos())?).ok().map(|t| Member(Some(t)))
    }

    fn once<'a>(slot: &mut Member<'a>, value: Option<Member<'a>>) -> Option<()> {
        if slot.0.is_some() {
            return None;
        }
        *slot = value?;
        Some(())
    }

    /// A member read as [`Nested`] reads it: an object of known members,
    /// or a scalar (present, with none of them).
    fn nested<'a, T: Default>(
        c: &mut Cursor<'a>,
        payload: &'a [u8],
        slot: &mut Nested<T>,
        mut member: impl FnMut(&mut T, &[u8], Member<'a>) -> Option<()>,
    ) -> Option<()> {
        if slot.0.is_some() {
            return None;
        }
        let mut t = T::default();
        if c.peek()? == b'{' {
            c.object(|c, key| member(&mut t, key, scalar(c, payload)?))?;
        } else {
            scalar(c, payload)?;
        }
        slot.0 = Some(t);
        Some(())
    }

    pub(super) fn top(payload: &[u8]) -> Option<Top<'_>> {
        let mut c = Cursor::new(payload);
        let mut top = Top::default();
        c.ws();
        c.object(|c, key| match key {
            b"id" => once(&mut top.id, scalar(c, payload)),
            b"ok" => once(&mut top.ok, scalar(c, payload)),
            b"result" => nested(c, payload, &mut top.result, |r: &mut ResultPart<'_>, key, v| match key {
                b"handle" => once(&mut r.handle, Some(v)),
                b"data" => once(&mut r.data, Some(v)),
                b"eof" => once(&mut r.eof, Some(v)),
                b"written" => once(&mut r.written, Some(v)),
                b"fd" => once(&mut r.fd, Some(v)),
                b"xml" => once(&mut r.xml, Some(v)),
                _ => None,
            }),
            b"error" => nested(c, payload, &mut top.error, |e: &mut ErrorPart<'_>, key, v| match key {
                b"code" => once(&mut e.code, Some(v)),
                b"message" => once(&mut e.message, Some(v)),
                _ => None,
            }),
            _ => None,
        })?;
        c.at_end().then_some(top)
    }
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
        if let Some(mut top) = scan::top(payload) {
            let error = top.error.0.take().unwrap_or_default();
            return Ok(Response { payload, top, error });
        }
        Self::parse_by_serde(payload)
    }

    /// What [`Response::parse`] gives, every case read by serde_json.
    /// The whole frame must be JSON as `Value` reads it: the members `Top`
    /// skips, serde skips unchecked (a byte that is not UTF-8, a lone
    /// surrogate, a number out of range would pass).
    fn parse_by_serde(payload: &'a [u8]) -> Result<Self, String> {
        let v = serde_json::from_slice::<Value>(payload).map_err(|e| format!("response is not JSON: {e}"))?;
        match serde_json::from_slice::<Top<'a>>(payload) {
            Ok(mut top) => {
                let error = top.error.0.take().unwrap_or_default();
                Ok(Response { payload, top, error })
            }
            Err(_) => Err(format!("{v}")),
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
        self.top.result.0
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
            fd: r.get("fd").and_then(Value::as_str).map(str::to_owned),
            xml: r.get("xml").and_then(Value::as_str).map(str::to_owned),
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
        fd: Option<String>,
        xml: Option<String>,
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
            fd: p.fd.as_str().map(Cow::into_owned),
            xml: p.xml.as_str().map(Cow::into_owned),
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
                proptest::option::of(member(&["handle", "data", "eof", "written", "fd", "xml", "y"])),
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
        fn the_view_reads_what_value_reads(v in response(), pretty in any::<bool>()) {
            // Pretty: whitespace between every token.
            let bytes = if pretty { serde_json::to_vec_pretty(&v) } else { serde_json::to_vec(&v) }.unwrap();
            if let Some(top) = scan::top(&bytes) {
                // Where the scanner answers, serde_json's reading agrees.
                let by_serde = Response::parse_by_serde(&bytes).expect("an object");
                let mut top = top;
                let error = top.error.0.take().unwrap_or_default();
                let scanned = Response { payload: &bytes, top, error };
                prop_assert_eq!(by_view(&scanned), by_view(&by_serde));
            }
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
    fn the_proxy_s_answers_are_scanned() {
        for frame in [
            &br#"{"id":"c1-2","ok":true,"result":{"handle":3}}"#[..],
            br#"{"id":"c1-3","ok":true,"result":{"data":"aGk=","eof":false}}"#,
            br#"{"id":"c1-4","ok":true,"result":{"written":0}}"#,
            br#"{"id":"c1-5","ok":true}"#,
            br#"{"id":null,"ok":false,"error":{"code":"E_ARG","message":"missing id"}}"#,
        ] {
            assert!(scan::top(frame).is_some(), "{}", String::from_utf8_lossy(frame));
        }
        for frame in [
            &br#"{"id":"a\"b","ok":true}"#[..],
            br#"{"id":"1","ok":true,"result":{"handle":-3}}"#,
            br#"{"id":"1","ok":true,"result":{"handle":3.0}}"#,
            br#"{"id":"1","ok":true,"id":"2"}"#,
            br#"{"id":"1","ok":true,"extra":1}"#,
            br#"{"id":"1","ok":true} x"#,
            b"{\"id\":\"\xff\",\"ok\":true}",
            b"{\"id\":\"a\tb\",\"ok\":true}",
            br#"{"id":"1","ok":true,"result":[1]}"#,
        ] {
            assert!(scan::top(frame).is_none(), "{}", String::from_utf8_lossy(frame));
        }
    }

    /// A member the checkers do not read is still part of the JSON: a
    /// response with bytes there that are not JSON is refused, as
    /// `Value` refuses it.
    #[test]
    fn a_response_that_is_not_json_anywhere_is_refused() {
        for frame in [
            &b"{\"id\":\"1\",\"ok\":true,\"extra\":\"\xff\"}"[..],
            br#"{"id":"1","ok":true,"extra":"\ud800"}"#,
            br#"{"id":"1","ok":true,"extra":1e999}"#,
            br#"{"id":"1","ok":true,"result":{"y":["\udc00"]}}"#,
            br#"{"id":"1","ok":false,"error":[1e400]}"#,
            br#"{"id":"1","ok":true,"result":{"handle":1e999}}"#,
        ] {
            let e = serde_json::from_slice::<Value>(frame).expect_err("not JSON");
            let shown = String::from_utf8_lossy(frame);
            assert_eq!(Response::parse(frame).err(), Some(format!("response is not JSON: {e}")), "{shown}");
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
