//! Procedural macros of `lambdastore-sdk`; use them through its re-exports
//! (`lambdastore_sdk::lambda_object`, `lambdastore_sdk::lambda_functions`),
//! where they are documented.
//!
//! Both macros leave the author's item as written (minus the helper
//! attributes `#[constructor]`, `#[protected]`, `#[readonly]`, `#[migrate(N)]`) and add
//! implementations next to it. Mistakes are `syn::Error`s pointing at the
//! offending tokens.

use proc_macro::TokenStream;

mod functions;
mod object;

/// The migration's name; `lambdastore_sdk::desc::MIGRATE` (a proc-macro
/// crate cannot depend on the crate it serves).
const MIGRATE: &str = "migrate";

/// Marks a struct of typed fields as an object type. See `lambdastore_sdk::lambda_object`.
#[proc_macro_attribute]
pub fn lambda_object(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand(attr, item, object::expand)
}

/// Exports the functions of an object type. See `lambdastore_sdk::lambda_functions`.
#[proc_macro_attribute]
pub fn lambda_functions(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand(attr, item, functions::expand)
}

fn expand(
    attr: TokenStream,
    item: TokenStream,
    f: fn(proc_macro2::TokenStream) -> syn::Result<proc_macro2::TokenStream>,
) -> TokenStream {
    let attr = proc_macro2::TokenStream::from(attr);
    let result = if attr.is_empty() {
        f(item.into())
    } else {
        Err(syn::Error::new_spanned(attr, "this attribute takes no arguments"))
    };
    result.unwrap_or_else(syn::Error::into_compile_error).into()
}

#[cfg(test)]
mod tests {
    use quote::quote;

    fn error(
        f: fn(proc_macro2::TokenStream) -> syn::Result<proc_macro2::TokenStream>,
        input: proc_macro2::TokenStream,
    ) -> String {
        match f(input) {
            Ok(tokens) => panic!("expected an error, got {tokens}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn object_mistakes() {
        let object = super::object::expand;
        assert!(error(
            object,
            quote!(
                enum E {
                    A,
                }
            )
        )
        .contains("goes on a struct"));
        assert!(error(
            object,
            quote!(
                struct S<T> {
                    a: Cell<T>,
                }
            )
        )
        .contains("cannot be generic"));
        assert!(error(
            object,
            quote!(
                struct S(Cell<i64>);
            )
        )
        .contains("need names"));
    }

    #[test]
    fn object_expands() {
        let tokens = super::object::expand(quote!(
            pub struct S {
                a: Cell<i64>,
                r#type: Map<u8, u8>,
            }
        ))
        .unwrap()
        .to_string();
        assert!(tokens.contains("\"a\"") && tokens.contains("\"type\""), "{tokens}");
    }

    #[test]
    fn function_mistakes() {
        let functions = super::functions::expand;
        let cases = [
            (quote!(impl Tr for S {}), "not a trait impl"),
            (
                quote!(
                    impl<T> S<T> {}
                ),
                "cannot be generic",
            ),
            (quote!(impl S { const X: u8 = 1; }), "only functions belong"),
            (quote!(impl S { fn f(&mut self) {} }), "take `&self`"),
            (quote!(impl S { fn f(self) {} }), "take `&self`"),
            (quote!(impl S { async fn f(&self) {} }), "plain `fn`s"),
            (quote!(impl S { fn f<T>(&self, t: T) {} }), "cannot be generic"),
            (quote!(impl S { fn f(&self, (a, b): (u8, u8)) {} }), "plain name"),
            (quote!(impl S { fn f(&self, s: &str) {} }), "owned type"),
            (quote!(impl S { fn f(&self) -> impl Serialize { 1 } }), "concrete type"),
            (quote!(impl S { #[constructor] fn new() {} }), "takes `&self`"),
            (quote!(impl S { #[constructor] fn new(&self) -> u8 { 1 } }), "returns nothing or `Result<(), E>`"),
            (quote!(impl S { #[constructor] #[readonly] fn new(&self) {} }), "cannot be readonly"),
            (quote!(impl S { #[constructor] fn a(&self) {} #[constructor] fn b(&self) {} }), "at most one constructor"),
            (quote!(impl S { #[readonly] #[readonly] fn f(&self) {} }), "duplicate attribute"),
            (quote!(impl S { #[readonly(yes)] fn f(&self) {} }), "unexpected token"),
            (quote!(impl S { fn id(&self) {} }), "reserved"),
            (quote!(impl S { #[migrate] fn migrate(&self, from: u32) {} }), "write `#[migrate(N)]`"),
            (quote!(impl S { #[migrate(1)] fn migrate(&self, from: u32) {} }), "a migration goes to 2 or later"),
            (quote!(impl S { #[migrate(2)] fn upgrade(&self, from: u32) {} }), "is called `migrate`"),
            (quote!(impl S { #[migrate(2)] fn migrate(&self) {} }), "takes `(&self, from: u32)`"),
            (quote!(impl S { #[migrate(2)] #[readonly] fn migrate(&self, from: u32) {} }), "not protected or readonly"),
            (
                quote!(impl S { #[migrate(2)] fn migrate(&self, from: u32) -> u32 { 2 } }),
                "returns nothing or `Result<(), E>`",
            ),
            (quote!(impl S { #[migrate(2)] fn migrate(&self, from: u32) {} }), "needs a #[constructor]"),
        ];
        for (input, expected) in cases {
            let message = error(functions, input.clone());
            assert!(message.contains(expected), "{input}: {message}");
        }
    }

    #[test]
    fn every_mistake_is_reported_at_once() {
        let input = quote!(impl S { fn a(&mut self) {} fn b(&self, s: &str) {} });
        let e = super::functions::expand(input).unwrap_err();
        assert_eq!(e.into_iter().count(), 2);
    }

    #[test]
    fn helper_attributes_are_stripped() {
        let tokens = super::functions::expand(quote!(impl S {
            #[constructor] fn new(&self) {}
            #[protected] #[readonly] fn f(&self) -> Result<u8, String> { Ok(1) }
            fn g() {}
        }))
        .unwrap()
        .to_string();
        assert!(!tokens.contains("# [protected]") && !tokens.contains("# [readonly]"), "{tokens}");
        assert!(tokens.contains("pub struct SRef"), "{tokens}");
        assert!(tokens.contains("protected : true , readonly : true"), "{tokens}");
    }
}
