//! What an application says about itself: the WIT `describe` records, and the
//! [`Application`] trait that [`app!`](crate::app) implements.

use crate::{CallError, ObjectId};

/// The name of the method that migrates an object's fields
/// (`#[migrate(N)]`): the host lets it write even under a readonly caller
/// on the same object, and `lambdastore.migrate_objects` calls it.
pub const MIGRATE: &str = "migrate";

/// How a function is invoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FunctionKind {
    /// Runs on a new object right after it is created.
    Constructor,
    /// Runs on an existing object (`self`).
    Method,
    /// Runs without an object.
    Static,
}

/// How a field stores its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldKind {
    /// One value, stored under the empty key.
    Cell,
    /// Ordered keys to values.
    Map,
    /// Ordered keys to several values (key ++ unique suffix).
    MultiMap,
    /// Ordered keys without values.
    Set,
}

/// A field of an object type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldDesc {
    /// The Rust field name; also the `field` column of its entries.
    pub name: String,
    /// Its storage kind.
    pub kind: FieldKind,
}

/// A function of an object type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionDesc {
    /// The Rust function name.
    pub name: String,
    /// Constructor, method or static.
    pub kind: FunctionKind,
    /// Callable only by lambdas of the same application.
    pub protected: bool,
    /// Promises not to write.
    pub readonly: bool,
}

/// An object type: its fields and functions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeDesc {
    /// The Rust type name.
    pub name: String,
    /// Fields in declaration order.
    pub fields: Vec<FieldDesc>,
    /// Functions in declaration order.
    pub functions: Vec<FunctionDesc>,
}

impl TypeDesc {
    /// The function called `name`, if any.
    pub fn function(&self, name: &str) -> Option<&FunctionDesc> {
        self.functions.iter().find(|f| f.name == name)
    }

    /// The constructor, if the type has one (it has at most one).
    pub fn constructor(&self) -> Option<&FunctionDesc> {
        self.functions.iter().find(|f| f.kind == FunctionKind::Constructor)
    }
}

/// A whole application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppDesc {
    /// Version of the SDK that built the application.
    pub sdk: String,
    /// Its object types.
    pub types: Vec<TypeDesc>,
}

impl AppDesc {
    /// The type called `name`, if any.
    pub fn type_desc(&self, name: &str) -> Option<&TypeDesc> {
        self.types.iter().find(|t| t.name == name)
    }
}

/// An application: what the component exports, callable natively too (the
/// [`MockHost`](crate::mock::MockHost) drives it in tests).
///
/// [`app!`](crate::app) implements it on a generated `App` struct; there is no
/// need to implement it by hand.
pub trait Application {
    /// The application's types and functions.
    fn describe() -> AppDesc;

    /// Runs one function. `object` is the object for constructors and
    /// methods, 0 for static functions. Arguments and result are JSON text.
    fn dispatch(
        kind: FunctionKind,
        type_name: &str,
        function: &str,
        object: ObjectId,
        args: &str,
    ) -> Result<String, CallError>;
}

/// An object type: implemented by [`#[lambda_object]`](crate::lambda_object).
pub trait LambdaObject: Sized {
    /// The type's name (the Rust identifier).
    const NAME: &'static str;

    /// The object with each field bound to its name.
    fn lambda_bind() -> Self;

    /// The fields, in declaration order.
    fn lambda_fields() -> Vec<FieldDesc>;
}

/// The functions of an object type: implemented by
/// [`#[lambda_functions]`](crate::lambda_functions).
pub trait LambdaFunctions: LambdaObject {
    /// The functions, in declaration order.
    fn lambda_functions() -> Vec<FunctionDesc>;

    /// Decodes `args`, runs `function` and encodes its result.
    fn lambda_dispatch(kind: FunctionKind, function: &str, object: ObjectId, args: &str) -> Result<String, CallError>;
}

/// The description of type `T`.
pub fn type_desc<T: LambdaFunctions>() -> TypeDesc {
    TypeDesc { name: T::NAME.to_string(), fields: T::lambda_fields(), functions: T::lambda_functions() }
}
