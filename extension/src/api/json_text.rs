//! `jsonb` as its text, for what lambdas take and return: JSON text is all
//! a lambda sees. pgrx's `JsonB` parses the text into a `serde_json::Value`
//! and prints it again on the way in and out; for a warm call that read 5
//! entries those two round trips were 5% of the backend's time.

use pgrx::callconv::{Arg, ArgAbi, BoxRet, FcInfo};
use pgrx::datum::Datum;
use pgrx::pg_sys;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::{direct_function_call, direct_function_call_as_datum, FromDatum, IntoDatum};
use std::ffi::{CStr, CString};

/// The text of a `jsonb` value (as `jsonb_out` prints it), or text to
/// become one (through `jsonb_in`, which raises 22P02 on invalid JSON).
pub struct JsonText(pub String);

impl FromDatum for JsonText {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
        if is_null {
            return None;
        }
        // SAFETY: the datum is a jsonb (the function's declared type);
        // jsonb_out detoasts it and returns a palloc'd C string.
        unsafe {
            let text = direct_function_call::<&CStr>(pg_sys::jsonb_out, &[Some(datum)])
                .expect("jsonb_out returns text");
            let owned = text.to_string_lossy().into_owned();
            pg_sys::pfree(text.as_ptr().cast_mut().cast());
            Some(JsonText(owned))
        }
    }
}

impl IntoDatum for JsonText {
    fn into_datum(self) -> Option<pg_sys::Datum> {
        // JSON text has no NUL outside escapes; callers validate it first.
        let text = CString::new(self.0).expect("JSON text contains no NUL byte");
        // SAFETY: jsonb_in takes a C string and returns a new jsonb.
        unsafe { direct_function_call_as_datum(pg_sys::jsonb_in, &[Some(text.as_ptr().into())]) }
    }

    fn type_oid() -> pg_sys::Oid {
        pg_sys::JSONBOID
    }
}

// SAFETY: the SQL type is jsonb, which FromDatum/IntoDatum above read and write.
unsafe impl SqlTranslatable for JsonText {
    const TYPE_IDENT: &'static str = pgrx::pgrx_resolved_type!(JsonText);
    const TYPE_ORIGIN: TypeOrigin = TypeOrigin::External;
    const ARGUMENT_SQL: Result<SqlMappingRef, ArgumentError> = Ok(SqlMappingRef::literal("jsonb"));
    const RETURN_SQL: Result<ReturnsRef, ReturnsError> = Ok(ReturnsRef::One(SqlMappingRef::literal("jsonb")));
}

// SAFETY: as pgrx does for its own FromDatum types.
unsafe impl<'fcx> ArgAbi<'fcx> for JsonText {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        let index = arg.index();
        // SAFETY: the argument is a non-null jsonb.
        unsafe { arg.unbox_arg_using_from_datum() }.unwrap_or_else(|| panic!("argument {index} must not be null"))
    }
}

// SAFETY: as pgrx does for its own IntoDatum types.
unsafe impl BoxRet for JsonText {
    unsafe fn box_into<'fcx>(self, fcinfo: &mut FcInfo<'fcx>) -> Datum<'fcx> {
        match self.into_datum() {
            // SAFETY: a jsonb datum for a function returning jsonb.
            Some(datum) => unsafe { fcinfo.return_raw_datum(datum) },
            None => fcinfo.return_null(),
        }
    }
}
