//! The OpenAPI 3.1 document served at /openapi.json. Routes and bodies come
//! from the handlers' annotations; every operation also lists the error
//! responses the gateway can give, all with the one error shape.

use crate::error::{ErrorBody, SQLSTATES};
use crate::routes;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::schema::{Schema, SchemaType, Type};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::RefOr;
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, Required, ResponseBuilder};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "LambdaStore gateway",
        description = "Deploy, create, invoke and submit LambdaStore calls over HTTP. \
        Authenticate with an application's API key (`Authorization: Bearer <key>`, created with `lambdastore.create_api_key`)."
    ),
    paths(
        routes::deploy,
        routes::create_object,
        routes::invoke,
        routes::invoke_static,
        routes::submit,
        routes::job,
        routes::wait,
        routes::healthz,
        routes::readyz,
        routes::metrics,
        routes::openapi,
    ),
    components(schemas(ErrorBody))
)]
struct ApiDoc;

/// Statuses the gateway itself gives, besides the SQLSTATE table's.
const GATEWAY_ERRORS: &[(u16, &str)] = &[
    (400, "Malformed request: bad JSON, a path parameter of the wrong type, an invalid Idempotency-Key, or invalid arguments"),
    (401, "No API key, or an invalid or revoked one"),
    (405, "The route does not take this HTTP method"),
    (408, "The request body did not arrive within --read-timeout"),
    (413, "The body is larger than --max-body-bytes, or the arguments or result exceed the extension's limits"),
    (415, "The body has the wrong Content-Type"),
    (429, "This API key has --max-waits-per-key waits in flight already; retry after `Retry-After` seconds"),
    (500, "Internal error; details are in the gateway's log"),
    (501, "A Transfer-Encoding other than chunked"),
    (503, "The database is unreachable, read-only or out of connections"),
    (504, "The request or the function took longer than its timeout"),
];

fn describe(status: u16) -> String {
    let mut text = GATEWAY_ERRORS.iter().find(|(s, _)| *s == status).map(|(_, d)| d.to_string()).unwrap_or_default();
    let codes: Vec<String> =
        SQLSTATES.iter().filter(|(_, s, _)| *s == status).map(|(state, _, code)| format!("{code} ({state})")).collect();
    if !codes.is_empty() {
        if !text.is_empty() {
            text.push_str("; ");
        }
        text.push_str(&codes.join(", "));
    }
    text
}

fn error_statuses() -> Vec<u16> {
    let mut statuses: Vec<u16> =
        GATEWAY_ERRORS.iter().map(|(s, _)| *s).chain(SQLSTATES.iter().map(|(_, s, _)| *s)).collect();
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

/// No U+0000: PostgreSQL's `text` and `jsonb` cannot hold it (such a request is 400).
const NO_NUL: &str = "^[^\\u0000]*$";

/// Call arguments are stored as `jsonb`: a JSON object (by name), an array
/// (by position) or null, whose strings and keys have no U+0000.
fn argument_schemas() -> [(&'static str, serde_json::Value); 2] {
    let array = serde_json::json!({"type": "array", "items": {"$ref": "#/components/schemas/JsonValue"}});
    let object = serde_json::json!({
        "type": "object",
        "propertyNames": {"type": "string", "pattern": NO_NUL},
        "additionalProperties": {"$ref": "#/components/schemas/JsonValue"},
    });
    [
        (
            "Arguments",
            serde_json::json!({
                "description": "The arguments: an object (by parameter name), an array (by position) or null. \
                    Strings and keys may not contain U+0000, which PostgreSQL's jsonb cannot store.",
                "anyOf": [object, array, {"type": "null"}],
            }),
        ),
        (
            "JsonValue",
            serde_json::json!({
                "description": "Any JSON value whose strings and keys contain no U+0000.",
                "anyOf": [{"type": ["null", "boolean", "number"]}, {"type": "string", "pattern": NO_NUL}, array, object],
            }),
        ),
    ]
}

fn schema(json: serde_json::Value) -> Schema {
    serde_json::from_value(json).expect("a valid schema")
}

/// Request bodies and path parameters as the gateway takes them: JSON bodies
/// are call arguments (`Arguments`), a module is non-empty bytes, and a
/// string in the path has no U+0000.
fn constrain_inputs(doc: &mut Document) {
    let components = doc.components.get_or_insert_with(Default::default);
    for (name, json) in argument_schemas() {
        components.schemas.insert(name.to_string(), schema(json).into());
    }
    for (_, op) in operations(doc) {
        if let Some(body) = op.request_body.as_mut() {
            if body.content.contains_key("application/json") {
                // Optional: an empty body means {}.
                body.content
                    .values_mut()
                    .for_each(|content| content.schema = Some(Ref::from_schema_name("Arguments").into()));
            } else {
                body.required = Some(Required::True);
                for content in body.content.values_mut() {
                    content.schema =
                        Some(schema(serde_json::json!({"type": "string", "format": "binary", "minLength": 1})).into());
                }
            }
        }
        for parameter in op.parameters.iter_mut().flatten().filter(|p| p.parameter_in == ParameterIn::Path) {
            if let Some(RefOr::T(Schema::Object(object))) = parameter.schema.as_mut() {
                if object.schema_type == SchemaType::Type(Type::String) {
                    object.pattern = Some(NO_NUL.to_string());
                }
            }
        }
    }
}

/// Sets `maximum` of the wait operation's `timeout_ms`: a larger one is 400.
fn limit_wait(doc: &mut Document, max: Duration) {
    let wait = doc.paths.paths.get_mut("/v1/jobs/{job_id}/wait").and_then(|item| item.get.as_mut());
    let parameters = wait.and_then(|op| op.parameters.as_mut()).into_iter().flatten();
    for parameter in parameters.filter(|p| p.name == "timeout_ms") {
        if let Some(RefOr::T(Schema::Object(schema))) = parameter.schema.as_mut() {
            let ms = usize::try_from(max.as_millis()).unwrap_or(usize::MAX);
            schema.maximum = Some(utoipa::Number::UInt(ms));
        }
    }
}

/// The document for this gateway; `max_wait` (its configuration's longest
/// `timeout_ms`, fixed for the process) becomes the wait parameter's maximum.
pub fn document(max_wait: Duration) -> &'static Document {
    static DOCUMENT: OnceLock<Document> = OnceLock::new();
    DOCUMENT.get_or_init(|| build(Some(max_wait)))
}

fn build(max_wait: Option<Duration>) -> Document {
    let mut doc = ApiDoc::openapi();
    if let Some(max) = max_wait {
        limit_wait(&mut doc, max);
    }
    constrain_inputs(&mut doc);
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "api_key",
        SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
    );
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_is_openapi_3_1_with_every_route_and_the_error_shape() {
        let json = serde_json::to_value(build(None)).unwrap();
        assert!(json["openapi"].as_str().unwrap().starts_with("3.1"));
        for path in
            ["/v1/objects/{object_id}/methods/{method}", "/v1/jobs/{job_id}/wait", "/v1/apps/{app}/module", "/metrics"]
        {
            assert!(json["paths"][path].is_object(), "{path} missing");
        }
        let invoke = &json["paths"]["/v1/objects/{object_id}/methods/{method}"]["post"]["responses"];
        for status in ["200", "401", "403", "404", "409", "422", "502", "504"] {
            assert!(invoke[status].is_object(), "invoke lacks {status}");
        }
        assert!(json["components"]["schemas"]["ErrorBody"].is_object());
    }

    #[test]
    fn the_input_schemas_survive_the_round_trip() {
        for (name, json) in argument_schemas() {
            assert_eq!(serde_json::to_value(schema(json.clone())).unwrap(), json, "{name}");
        }
        let json = serde_json::to_value(build(None)).unwrap();
        let invoke = &json["paths"]["/v1/objects/{object_id}/methods/{method}"]["post"];
        assert_eq!(
            invoke["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/Arguments"
        );
        assert_eq!(invoke["parameters"][1]["schema"]["pattern"], NO_NUL);
        let deploy = &json["paths"]["/v1/apps/{app}/module"]["put"]["requestBody"]["content"];
        assert_eq!(deploy["application/wasm"]["schema"]["minLength"], 1);
        assert_eq!(json["paths"]["/v1/apps/{app}/module"]["put"]["requestBody"]["required"], true);
    }

    #[test]
    fn the_wait_timeout_is_limited_to_the_gateways() {
        let json = serde_json::to_value(build(Some(Duration::from_secs(29)))).unwrap();
        let parameters = json["paths"]["/v1/jobs/{job_id}/wait"]["get"]["parameters"].as_array().unwrap();
        let timeout = parameters.iter().find(|p| p["name"] == "timeout_ms").unwrap();
        assert_eq!(timeout["schema"]["maximum"], 29000);
    }
}
