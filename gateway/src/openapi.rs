//! The OpenAPI 3.1 document served at /openapi.json. Routes and bodies come
//! from the handlers' annotations; every operation also lists the error
//! responses the gateway can give, all with the one error shape.

use crate::error::{ErrorBody, SQLSTATES};
use crate::routes;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, ResponseBuilder};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "LambdaStore gateway", description = "Deploy, create, invoke and submit LambdaStore calls over HTTP. \
        Authenticate with an application's API key (`Authorization: Bearer <key>`, created with `lambdastore.create_api_key`)."),
    paths(
        routes::deploy, routes::create_object, routes::invoke, routes::invoke_static, routes::submit,
        routes::job, routes::wait, routes::healthz, routes::readyz, routes::metrics, routes::openapi,
    ),
    components(schemas(ErrorBody)),
)]
struct ApiDoc;

/// Statuses the gateway itself gives, besides the SQLSTATE table's.
const GATEWAY_ERRORS: &[(u16, &str)] = &[
    (400, "Malformed request: bad JSON, a path parameter of the wrong type, an invalid Idempotency-Key, or invalid arguments"),
    (401, "No API key, or an invalid or revoked one"),
    (405, "The route does not take this HTTP method"),
    (413, "The body is larger than --max-body-bytes, or the arguments or result exceed the extension's limits"),
    (415, "The body has the wrong Content-Type"),
    (500, "Internal error; details are in the gateway's log"),
    (503, "The database is unreachable or out of connections"),
    (504, "The request or the function took longer than its timeout"),
];

fn describe(status: u16) -> String {
    let mut text = GATEWAY_ERRORS.iter().find(|(s, _)| *s == status).map(|(_, d)| d.to_string()).unwrap_or_default();
    let codes: Vec<String> = SQLSTATES.iter().filter(|(_, s, _)| *s == status).map(|(state, _, code)| format!("{code} ({state})")).collect();
    if !codes.is_empty() {
        if !text.is_empty() {
            text.push_str("; ");
        }
        text.push_str(&codes.join(", "));
    }
    text
}

fn error_statuses() -> Vec<u16> {
    let mut statuses: Vec<u16> = GATEWAY_ERRORS.iter().map(|(s, _)| *s).chain(SQLSTATES.iter().map(|(_, s, _)| *s)).collect();
    statuses.sort_unstable();
    statuses.dedup();
    statuses
}

fn operations(doc: &mut Document) -> impl Iterator<Item = (&String, &mut Operation)> {
    doc.paths.paths.iter_mut().flat_map(|(path, item)| {
        [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch]
            .into_iter()
            .filter_map(move |op| op.as_mut().map(|op| (path, op)))
    })
}

pub fn document() -> &'static Document {
    static DOCUMENT: OnceLock<Document> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let mut doc = ApiDoc::openapi();
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme("api_key", SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()));
        let statuses = error_statuses();
        let mut responses = BTreeMap::new();
        for status in &statuses {
            let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
            responses.insert(
                format!("Error{status}"),
                ResponseBuilder::new().description(describe(*status)).content("application/json", content).build(),
            );
        }
        components.responses.extend(responses.into_iter().map(|(k, v)| (k, v.into())));
        for (path, op) in operations(&mut doc) {
            // The operations probes call cannot fail with a request error.
            let probes = !path.starts_with("/v1/");
            for status in &statuses {
                if probes && ![405, 500, 503].contains(status) {
                    continue;
                }
                op.responses
                    .responses
                    .entry(status.to_string())
                    .or_insert_with(|| Ref::new(format!("#/components/responses/Error{status}")).into());
            }
        }
        doc
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_is_openapi_3_1_with_every_route_and_the_error_shape() {
        let json = serde_json::to_value(document()).unwrap();
        assert!(json["openapi"].as_str().unwrap().starts_with("3.1"));
        for path in ["/v1/objects/{object_id}/methods/{method}", "/v1/jobs/{job_id}/wait", "/v1/apps/{app}/module", "/metrics"] {
            assert!(json["paths"][path].is_object(), "{path} missing");
        }
        let invoke = &json["paths"]["/v1/objects/{object_id}/methods/{method}"]["post"]["responses"];
        for status in ["200", "401", "403", "404", "409", "422", "502", "504"] {
            assert!(invoke[status].is_object(), "invoke lacks {status}");
        }
        assert!(json["components"]["schemas"]["ErrorBody"].is_object());
    }
}
