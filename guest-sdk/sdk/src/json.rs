//! Values written as JSON, byte for byte as `serde_json` writes them, with
//! a fast path for the commonest stored value: a string with nothing to
//! escape. serde_json looks every byte of a string up in a table, one at a
//! time; in a call writing five 1 KiB strings that was a third of the
//! guest's time (docs/PERFORMANCE.md, "Writes written over their rows").
//! Here a string is checked eight bytes at a time and, needing no escape,
//! copied as it is; anything else goes to serde_json.

use serde::ser::{self, Impossible, Serialize, Serializer};
use std::fmt;

/// Appends `value` as JSON to `buffer`, as `serde_json::to_writer` would.
pub(crate) fn to_writer<V: Serialize + ?Sized>(buffer: &mut Vec<u8>, value: &V) -> serde_json::Result<()> {
    match value.serialize(PlainString(buffer)) {
        Ok(Written) => Ok(()),
        Err(NotPlain) => serde_json::to_writer(buffer, value),
    }
}

/// Whether JSON escapes any byte of `bytes`: a control character (below
/// 0x20), `"` or `\`.
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    // Whether any byte of `word` is zero (exact: no false positives in the
    // word as a whole), and whether any is below `n` (n <= 128).
    let has_zero = |word: u64| word.wrapping_sub(ONES) & !word & HIGH != 0;
    let has_below = |word: u64, n: u8| word.wrapping_sub(ONES * u64::from(n)) & !word & HIGH != 0;
    let (words, tail) = bytes.as_chunks::<8>();
    words.iter().any(|chunk| {
        let word = u64::from_ne_bytes(*chunk);
        has_below(word, 0x20) || has_zero(word ^ (ONES * u64::from(b'"'))) || has_zero(word ^ (ONES * u64::from(b'\\')))
    }) || tail.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

/// A serializer that writes a plain string (or a newtype or `Some` of one)
/// and refuses everything else before writing anything.
struct PlainString<'a>(&'a mut Vec<u8>);

/// The value was written.
struct Written;

/// The value is not a string needing no escape: serde_json writes it.
#[derive(Debug)]
struct NotPlain;

impl fmt::Display for NotPlain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a plain string")
    }
}

impl std::error::Error for NotPlain {}

impl ser::Error for NotPlain {
    fn custom<T: fmt::Display>(_: T) -> Self {
        NotPlain
    }
}

/// Serializer methods that refuse their value.
macro_rules! not_plain {
    ($($method:ident($($arg:ty),*) -> $ok:ty;)*) => {
        $(fn $method(self, $(_: $arg),*) -> Result<$ok, NotPlain> {
            Err(NotPlain)
        })*
    };
}

impl Serializer for PlainString<'_> {
    type Ok = Written;
    type Error = NotPlain;
    type SerializeSeq = Impossible<Written, NotPlain>;
    type SerializeTuple = Impossible<Written, NotPlain>;
    type SerializeTupleStruct = Impossible<Written, NotPlain>;
    type SerializeTupleVariant = Impossible<Written, NotPlain>;
    type SerializeMap = Impossible<Written, NotPlain>;
    type SerializeStruct = Impossible<Written, NotPlain>;
    type SerializeStructVariant = Impossible<Written, NotPlain>;

    fn serialize_str(self, value: &str) -> Result<Written, NotPlain> {
        if needs_escape(value.as_bytes()) {
            return Err(NotPlain);
        }
        self.0.reserve(value.len() + 2);
        self.0.push(b'"');
        self.0.extend_from_slice(value.as_bytes());
        self.0.push(b'"');
        Ok(Written)
    }

    // serde_json writes these as the value inside.
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<Written, NotPlain> {
        value.serialize(self)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Written, NotPlain> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Written, NotPlain> {
        Err(NotPlain)
    }

    not_plain! {
        serialize_bool(bool) -> Written;
        serialize_i8(i8) -> Written;
        serialize_i16(i16) -> Written;
        serialize_i32(i32) -> Written;
        serialize_i64(i64) -> Written;
        serialize_u8(u8) -> Written;
        serialize_u16(u16) -> Written;
        serialize_u32(u32) -> Written;
        serialize_u64(u64) -> Written;
        serialize_f32(f32) -> Written;
        serialize_f64(f64) -> Written;
        serialize_char(char) -> Written;
        serialize_bytes(&[u8]) -> Written;
        serialize_none() -> Written;
        serialize_unit() -> Written;
        serialize_unit_struct(&'static str) -> Written;
        serialize_unit_variant(&'static str, u32, &'static str) -> Written;
        serialize_seq(Option<usize>) -> Self::SerializeSeq;
        serialize_tuple(usize) -> Self::SerializeTuple;
        serialize_tuple_struct(&'static str, usize) -> Self::SerializeTupleStruct;
        serialize_tuple_variant(&'static str, u32, &'static str, usize) -> Self::SerializeTupleVariant;
        serialize_map(Option<usize>) -> Self::SerializeMap;
        serialize_struct(&'static str, usize) -> Self::SerializeStruct;
        serialize_struct_variant(&'static str, u32, &'static str, usize) -> Self::SerializeStructVariant;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    fn ours<V: Serialize + ?Sized>(value: &V) -> Vec<u8> {
        let mut buffer = b"kept".to_vec();
        to_writer(&mut buffer, value).unwrap();
        buffer.split_off(4)
    }

    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        let mut strings: Vec<String> = vec![String::new(), "plain".into(), "é, ü and 😀".into(), "\u{7f}".into()];
        // Every character JSON escapes, and a few it does not, at every
        // position of a word and in the tail.
        for special in ['"', '\\', '\n', '\t', '\u{0}', '\u{1f}', ' ', '!', '#', '[', ']', '\u{80}', 'ÿ'] {
            for at in 0..20 {
                let mut s: String = "abcdefghijklmnopqrs".into();
                s.insert(at, special);
                strings.push(s);
            }
        }
        strings.push("x".repeat(1024));
        strings.push(format!("{}\"", "x".repeat(1023)));
        for s in &strings {
            assert_eq!(ours(s), serde_json::to_vec(s).unwrap(), "{s:?}");
            assert_eq!(ours(s.as_str()), serde_json::to_vec(s).unwrap(), "{s:?}");
        }
    }

    #[test]
    fn other_values_are_serde_jsons() {
        #[derive(Serialize)]
        struct Name(String);
        #[derive(Serialize)]
        struct Post {
            title: String,
            likes: u32,
        }
        #[derive(Serialize)]
        enum Shape {
            Circle(f64),
            Empty,
        }
        let post = Post { title: "a \"quoted\" title".into(), likes: 3 };
        assert_eq!(ours(&post), serde_json::to_vec(&post).unwrap());
        assert_eq!(ours(&Name("n".into())), br#""n""#);
        assert_eq!(ours(&Some("s")), br#""s""#);
        assert_eq!(ours(&None::<String>), b"null");
        assert_eq!(ours(&vec!["a", "b"]), br#"["a","b"]"#);
        assert_eq!(ours(&Shape::Circle(1.5)), serde_json::to_vec(&Shape::Circle(1.5)).unwrap());
        assert_eq!(ours(&Shape::Empty), br#""Empty""#);
        assert_eq!(ours(&'c'), br#""c""#);
        assert_eq!(ours(&42i64), b"42");
    }
}
