//! Finds NaN and infinities in a value before its JSON leaves the guest.
//!
//! JSON has no number for them, and serde_json writes them as `null`
//! without a word, so a result would silently lose them. Neither its
//! `Formatter` (which sees `null` either way) nor a `serde_json::Value`
//! (which holds `null` by then) can tell, so [`check`] walks the value
//! itself: a serializer that writes nothing and fails on a non-finite float.

use std::fmt;

use serde::ser::{self, Serialize};

/// Why a value cannot be written as JSON.
#[derive(Debug)]
pub(crate) struct NotJson(String);

impl fmt::Display for NotJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotJson {}

impl ser::Error for NotJson {
    fn custom<T: fmt::Display>(message: T) -> Self {
        NotJson(message.to_string())
    }
}

/// An error if `value` holds a non-finite float.
///
/// serde_json writes each as `null`, so a caller that has the JSON text
/// need only check a value whose text contains `null`.
pub(crate) fn check<T: Serialize + ?Sized>(value: &T) -> Result<(), NotJson> {
    value.serialize(Check)
}

/// The serializer: stateless, so it serves as its own compound serializers.
#[derive(Clone, Copy)]
struct Check;

fn finite(value: f64) -> Result<(), NotJson> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(NotJson("it contains a non-finite float (NaN or infinity), which JSON cannot represent".into()))
    }
}

/// Values without floats in them are fine as they are.
macro_rules! accept {
    ($($method:ident($($ty:ty),*)),* $(,)?) => {
        $(fn $method(self, $(_: $ty),*) -> Result<(), NotJson> { Ok(()) })*
    };
}

/// A compound value: the serializer checks its elements as they come.
macro_rules! open {
    ($($method:ident($($ty:ty),*)),* $(,)?) => {
        $(fn $method(self, $(_: $ty),*) -> Result<Check, NotJson> { Ok(self) })*
    };
}

impl ser::Serializer for Check {
    type Ok = ();
    type Error = NotJson;
    type SerializeSeq = Check;
    type SerializeTuple = Check;
    type SerializeTupleStruct = Check;
    type SerializeTupleVariant = Check;
    type SerializeMap = Check;
    type SerializeStruct = Check;
    type SerializeStructVariant = Check;

    accept!(
        serialize_bool(bool),
        serialize_i8(i8),
        serialize_i16(i16),
        serialize_i32(i32),
        serialize_i64(i64),
        serialize_i128(i128),
        serialize_u8(u8),
        serialize_u16(u16),
        serialize_u32(u32),
        serialize_u64(u64),
        serialize_u128(u128),
        serialize_char(char),
        serialize_str(&str),
        serialize_bytes(&[u8]),
        serialize_none(),
        serialize_unit(),
        serialize_unit_struct(&'static str),
        serialize_unit_variant(&'static str, u32, &'static str),
    );

    open!(
        serialize_seq(Option<usize>),
        serialize_tuple(usize),
        serialize_tuple_struct(&'static str, usize),
        serialize_tuple_variant(&'static str, u32, &'static str, usize),
        serialize_map(Option<usize>),
        serialize_struct(&'static str, usize),
        serialize_struct_variant(&'static str, u32, &'static str, usize),
    );

    fn serialize_f32(self, value: f32) -> Result<(), NotJson> {
        finite(value.into())
    }

    fn serialize_f64(self, value: f64) -> Result<(), NotJson> {
        finite(value)
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), NotJson> {
        value.serialize(self)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, value: &T) -> Result<(), NotJson> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        value: &T,
    ) -> Result<(), NotJson> {
        value.serialize(self)
    }

    // The default formats the value into a `String` first.
    fn collect_str<T: fmt::Display + ?Sized>(self, _: &T) -> Result<(), NotJson> {
        Ok(())
    }
}

/// The compound serializers: each element is checked like a whole value.
/// (Map keys are included: serde_json refuses a non-finite float key itself.)
macro_rules! compound {
    ($($trait:ident :: $method:ident($($name:ident),*)),* $(,)?) => {
        $(
            impl ser::$trait for Check {
                type Ok = ();
                type Error = NotJson;

                fn $method<T: Serialize + ?Sized>(
                    &mut self,
                    $($name: &'static str,)*
                    value: &T,
                ) -> Result<(), NotJson> {
                    value.serialize(*self)
                }

                fn end(self) -> Result<(), NotJson> {
                    Ok(())
                }
            }
        )*
    };
}

compound!(
    SerializeSeq::serialize_element(),
    SerializeTuple::serialize_element(),
    SerializeTupleStruct::serialize_field(),
    SerializeTupleVariant::serialize_field(),
    SerializeStruct::serialize_field(_key),
    SerializeStructVariant::serialize_field(_key),
);

impl ser::SerializeMap for Check {
    type Ok = ();
    type Error = NotJson;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), NotJson> {
        key.serialize(*self)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), NotJson> {
        value.serialize(*self)
    }

    fn end(self) -> Result<(), NotJson> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::check;

    #[derive(serde::Serialize)]
    enum Shape {
        Point { x: f64, y: f32 },
        Scale(f64),
    }

    #[test]
    fn finds_non_finite_floats_at_any_depth() {
        assert!(check(&f64::NAN).is_err());
        assert!(check(&Some(f32::INFINITY)).is_err());
        assert!(check(&vec![(1, f64::NEG_INFINITY)]).is_err());
        assert!(check(&BTreeMap::from([("a", vec![0.5, f64::NAN])])).is_err());
        assert!(check(&Shape::Point { x: 0.0, y: f32::NAN }).is_err());
        assert!(check(&Shape::Scale(f64::INFINITY)).is_err());
    }

    #[test]
    fn accepts_everything_else() {
        assert!(check(&(f64::MAX, f32::MIN_POSITIVE, -0.0f64)).is_ok());
        assert!(check(&(None::<f64>, (), "NaN", 'x', [1u8, 2])).is_ok());
        assert!(check(&Shape::Point { x: 1.0, y: 2.0 }).is_ok());
        assert!(check(&serde_json::json!({"null": null, "n": 1.5})).is_ok());
    }
}
