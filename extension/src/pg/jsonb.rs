//! `jsonb` as its text, for what lambdas take and return: JSON text is all
//! a lambda sees. pgrx's `JsonB` parses the text into a `serde_json::Value`
//! and prints it again on the way in and out; for a warm call that read 5
//! entries those two round trips were 5% of the backend's time.

use crate::error::{LambdaError, Result};
use pgrx::callconv::{Arg, ArgAbi, BoxRet, FcInfo};
use pgrx::datum::Datum;
use pgrx::pg_sys;
use pgrx::pg_sys::panic::CaughtError;
use pgrx::pgrx_sql_entity_graph::metadata::{
    ArgumentError, ReturnsError, ReturnsRef, SqlMappingRef, SqlTranslatable, TypeOrigin,
};
use pgrx::{direct_function_call, direct_function_call_as_datum, FromDatum, IntoDatum, PgTryBuilder};
use std::ffi::{CStr, CString};

/// The text of a `jsonb` value (as `jsonb_out` prints it), or a lambda's
/// result to become one (`result_jsonb`).
pub(crate) struct JsonText(pub String);

impl FromDatum for JsonText {
    unsafe fn from_polymorphic_datum(datum: pg_sys::Datum, is_null: bool, _: pg_sys::Oid) -> Option<Self> {
        if is_null {
            return None;
        }
        // SAFETY: the datum is a jsonb (the function's declared type);
        // jsonb_out detoasts it and returns a palloc'd C string.
        unsafe {
            let text =
                direct_function_call::<&CStr>(pg_sys::jsonb_out, &[Some(datum)]).expect("jsonb_out returns text");
            let owned = text.to_string_lossy().into_owned();
            pg_sys::pfree(text.as_ptr().cast_mut().cast());
            Some(JsonText(owned))
        }
    }
}

/// A lambda's result as jsonb. Text that jsonb cannot hold (not JSON, a
/// `\u0000`, a number out of jsonb's range, nesting past the stack) is the
/// lambda's fault, not the caller's: 38000 with PostgreSQL's reason, the
/// same for a synchronous call and for a job.
pub(crate) fn result_jsonb(text: &str) -> Result<pg_sys::Datum> {
    let not_jsonb = |why: String, detail: String| LambdaError::Trap {
        message: format!("the result is not valid jsonb: {why}"),
        backtrace: detail,
    };
    let Ok(text) = CString::new(text) else {
        return Err(not_jsonb("it contains a NUL byte".into(), String::new()));
    };
    // jsonb_in only parses and allocates, so its error can be caught
    // without a subtransaction; the statement (or the job's
    // subtransaction) fails with ours right after.
    PgTryBuilder::new(|| {
        // SAFETY: jsonb_in takes a C string and returns a new jsonb.
        let datum = unsafe { direct_function_call_as_datum(pg_sys::jsonb_in, &[Some(text.as_ptr().into())]) };
        Ok(datum.expect("jsonb_in returns a value"))
    })
    .catch_others(|caught| match caught {
        CaughtError::PostgresError(report) | CaughtError::ErrorReport(report) => {
            Err(not_jsonb(report.message().to_string(), report.detail().unwrap_or_default().to_string()))
        }
        CaughtError::RustPanic { ereport, .. } => Err(not_jsonb(ereport.message().to_string(), String::new())),
    })
    .execute()
}

impl IntoDatum for JsonText {
    /// For results only (arguments come in through `FromDatum`).
    fn into_datum(self) -> Option<pg_sys::Datum> {
        Some(result_jsonb(&self.0).unwrap_or_else(|err| err.report("")))
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
