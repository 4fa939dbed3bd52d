//! Paths in traces: a path is its text when it is UTF-8 (what serde
//! writes for a `PathBuf`), and `{"bytes": "<base64>"}` when it is not.
//!
//! A mounted filesystem's kernel names files in any bytes, and the FS
//! proxy joins them into the paths of its effects as they are; serde's own
//! `PathBuf` refuses to write such a path, so a recorded run lost the
//! effect's line and its trace no longer replayed. UTF-8 paths keep their
//! old spelling, so every trace written before reads as it did.

use crate::policy::bytes;
use serde::de::Error as _;
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serializer};
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

pub fn serialize<S: Serializer>(path: &Path, s: S) -> Result<S::Ok, S::Error> {
    match path.to_str() {
        Some(text) => s.serialize_str(text),
        None => {
            let mut st = s.serialize_struct("PathBytes", 1)?;
            st.serialize_field("bytes", &crate::b64::encode(bytes::bytes(path)))?;
            st.end()
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Repr {
    Text(String),
    Bytes { bytes: String },
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
    match Repr::deserialize(d)? {
        Repr::Text(text) => Ok(PathBuf::from(text)),
        Repr::Bytes { bytes } => {
            let raw = crate::b64::decode(bytes).map_err(D::Error::custom)?;
            Ok(PathBuf::from(OsString::from_vec(raw)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use std::os::unix::ffi::OsStrExt;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct P {
        #[serde(with = "super")]
        path: PathBuf,
    }

    #[test]
    fn utf8_paths_stay_text_and_others_round_trip_as_bytes() {
        let text = P { path: "/w/proj/a.txt".into() };
        let json = serde_json::to_string(&text).unwrap();
        assert_eq!(json, r#"{"path":"/w/proj/a.txt"}"#);
        assert_eq!(serde_json::from_str::<P>(&json).unwrap(), text);

        let raw = P { path: PathBuf::from(std::ffi::OsStr::from_bytes(b"/w/proj/n\xff\xfe")) };
        let json = serde_json::to_string(&raw).unwrap();
        assert_eq!(json, r#"{"path":{"bytes":"L3cvcHJvai9u//4="}}"#);
        assert_eq!(serde_json::from_str::<P>(&json).unwrap(), raw);
        assert!(serde_json::from_str::<P>(r#"{"path":{"bytes":"!!"}}"#).is_err());
    }
}
