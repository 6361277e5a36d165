//! `#[lambda_object]`: binds each field of a struct to its name.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Fields, ItemStruct};

pub fn expand(item: TokenStream) -> syn::Result<TokenStream> {
    let item: ItemStruct = syn::parse2(item)
        .map_err(|e| syn::Error::new(e.span(), "#[lambda_object] goes on a struct of typed fields"))?;
    if !item.generics.params.is_empty() || item.generics.where_clause.is_some() {
        return Err(syn::Error::new_spanned(
            &item.generics,
            "object types cannot be generic: the host knows them by name",
        ));
    }
    let fields: Vec<_> = match &item.fields {
        Fields::Named(named) => named.named.iter().collect(),
        Fields::Unit => Vec::new(),
        Fields::Unnamed(unnamed) => {
            return Err(syn::Error::new_spanned(
                unnamed,
                "object fields need names: each field is stored under its name",
            ))
        }
    };

    let ident = &item.ident;
    let name = ident.unraw().to_string();
    let mut binds = Vec::new();
    let mut descs = Vec::new();
    for field in fields {
        let field_ident = field.ident.as_ref().expect("named field");
        let field_name = field_ident.unraw().to_string();
        let ty = &field.ty;
        // Spanned on the type, so a field of another type is reported there.
        let as_field = quote_spanned!(ty.span()=> <#ty as ::lambdastore_sdk::Field>);
        binds.push(quote!(#field_ident: #as_field::bind(#field_name)));
        descs.push(quote! {
            ::lambdastore_sdk::desc::FieldDesc {
                name: ::std::string::String::from(#field_name),
                kind: #as_field::KIND,
            }
        });
    }
    let construct = match item.fields {
        Fields::Unit => quote!(#ident),
        _ => quote!(#ident { #(#binds,)* }),
    };

    Ok(quote! {
        #item

        #[automatically_derived]
        impl ::lambdastore_sdk::LambdaObject for #ident {
            const NAME: &'static str = #name;

            fn lambda_bind() -> Self {
                #construct
            }

            fn lambda_fields() -> ::std::vec::Vec<::lambdastore_sdk::desc::FieldDesc> {
                ::std::vec![#(#descs),*]
            }
        }
    })
}
