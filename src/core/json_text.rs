//! Stream payloads kept as JSON text: what a parse would refuse, checked without building a value,
//! and how long PostgreSQL may print the text once it is stored as jsonb.

use super::error::CoreError;
use super::validate::nul_error;

/// Checks JSON text kept unparsed (a stream payload) as parsing it into a value would: valid
/// escapes (no lone surrogate), numbers within a double's range, nesting within serde_json's
/// limit (128), and no NUL in any string or key, duplicates included. Nothing is built.
pub fn check_json_text(field: &str, text: &str) -> Result<(), CoreError> {
    match serde_json::from_str::<StorableJson>(text) {
        Ok(StorableJson) => Ok(()),
        Err(e) if e.to_string().starts_with(NUL_FOUND) => Err(nul_error(field)),
        Err(e) => Err(
            CoreError::invalid(format!("{field} is not JSON this server stores: {e}"))
                .with_detail("field", field.into()),
        ),
    }
}

const NUL_FOUND: &str = "NUL character";

/// A JSON value walked for [`check_json_text`].
struct StorableJson;

impl<'de> serde::Deserialize<'de> for StorableJson {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StorableJson)
    }
}

impl StorableJson {
    fn text<E: serde::de::Error>(s: &str) -> Result<Self, E> {
        if s.contains('\0') {
            Err(E::custom(NUL_FOUND))
        } else {
            Ok(StorableJson)
        }
    }
}

impl<'de> serde::de::Visitor<'de> for StorableJson {
    type Value = StorableJson;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(StorableJson)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(StorableJson)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(StorableJson)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(StorableJson)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(StorableJson)
    }
    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self, E> {
        Self::text(s)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<StorableJson>()?.is_some() {}
        Ok(StorableJson)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            Self::text::<A::Error>(&key)?;
            map.next_value::<StorableJson>()?;
        }
        Ok(StorableJson)
    }
}

/// An upper bound on the length of the text PostgreSQL prints for this JSON once stored as jsonb
/// (what `s3p.stream_event_bytes` counts): it adds a space after each `,` and `:`, and prints a
/// number written with an exponent in all its digits (`1e300` takes 301 characters, `1e-300`
/// 302); strings and the rest print no longer than sent. `text` is valid JSON.
pub fn jsonb_text_bound(text: &str) -> u64 {
    let bytes = text.as_bytes();
    let mut bound = bytes.len() as u64;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b',' | b':' => {
                bound += 1;
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                while i < bytes.len() && matches!(bytes[i], b'0'..=b'9' | b'.' | b'-') {
                    i += 1;
                }
                if i < bytes.len() && matches!(bytes[i], b'e' | b'E') {
                    i += 1;
                    if i < bytes.len() && matches!(bytes[i], b'+' | b'-') {
                        i += 1;
                    }
                    let mut exponent: u64 = 0;
                    while i < bytes.len() && bytes[i].is_ascii_digit() {
                        exponent = (exponent * 10 + u64::from(bytes[i] - b'0')).min(1 << 40);
                        i += 1;
                    }
                    // Digits moved past the point, zeros filled in, a point and a leading 0.
                    bound += exponent + 2;
                }
            }
            _ => i += 1,
        }
    }
    bound
}
