//! The Prometheus query client: one instant query per `[[health.prometheus]]`
//! check against the server's HTTP API (`GET /api/v1/query`), reduced to
//! what the verdict needs. Every request is bounded: the configured
//! `timeout` covers connect to last byte, and the body is read up to
//! [`MAX_BODY`] bytes.

use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

use crate::config::PrometheusCheck;

/// The largest response body read; a larger one is [`QueryOutcome::Rejected`].
/// A health query that returns megabytes of series is not a health query.
pub const MAX_BODY: usize = 1024 * 1024;

/// What one evaluation of a check returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryOutcome {
    /// The query returned no sample: healthy.
    Clear,
    /// The query returned samples: unhealthy.
    Firing {
        /// The first sample's series, such as `{instance="a", job="b"}`.
        series: String,
        /// The first sample's value as Prometheus printed it.
        value: String,
        /// How many samples were returned.
        samples: usize,
    },
    /// No answer: connection refused, timeout, a 5xx, a body cut short.
    Unreachable(String),
    /// Prometheus answered but not with a usable result: a query it refused
    /// (bad PromQL), a non-vector result, an oversized or malformed body.
    /// A configuration problem, so never skipped by `on_unreachable`.
    Rejected(String),
}

/// Errors building the client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The platform's root certificates could not be loaded.
    #[error("loading the root certificates for https: {0}")]
    Roots(#[source] crate::tls::Error),
}

/// A Prometheus API client shared by every check (one connection pool).
#[derive(Clone)]
pub struct PrometheusClient {
    http: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

impl PrometheusClient {
    /// A client for http and https URLs (https verified against the
    /// platform's root certificates).
    pub fn new() -> Result<Self, ClientError> {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        // The per-check timeout bounds the whole request; this one makes a
        // black-holed address fail before it rather than with it.
        tcp.set_connect_timeout(Some(Duration::from_secs(5)));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(crate::tls::client_config().map_err(ClientError::Roots)?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(2)
            .build(https);
        Ok(Self { http })
    }

    /// Evaluates `check` once, now.
    pub async fn evaluate(&self, check: &PrometheusCheck) -> QueryOutcome {
        let url = query_url(&check.url, &check.query);
        match tokio::time::timeout(check.timeout, self.fetch(&url)).await {
            Ok(outcome) => outcome,
            Err(_) => QueryOutcome::Unreachable(format!(
                "no answer within {}",
                humantime::format_duration(check.timeout)
            )),
        }
    }

    /// Evaluates every check concurrently, now; outcomes in `checks` order.
    /// Bounded by the longest `timeout` among them.
    pub async fn evaluate_all(&self, checks: &[PrometheusCheck]) -> Vec<QueryOutcome> {
        futures::future::join_all(checks.iter().map(|c| self.evaluate(c))).await
    }

    async fn fetch(&self, url: &str) -> QueryOutcome {
        let uri: hyper::Uri = match url.parse() {
            Ok(u) => u,
            Err(e) => return QueryOutcome::Rejected(format!("invalid URL {url}: {e}")),
        };
        let req = match hyper::Request::get(uri)
            .header(hyper::header::ACCEPT, "application/json")
            .header(hyper::header::USER_AGENT, "drover")
            .body(Empty::new())
        {
            Ok(r) => r,
            Err(e) => return QueryOutcome::Rejected(format!("building the request: {e}")),
        };
        let resp = match self.http.request(req).await {
            Ok(r) => r,
            Err(e) => return QueryOutcome::Unreachable(error_chain(&e)),
        };
        let status = resp.status();
        let body = match Limited::new(resp.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return QueryOutcome::Rejected(format!(
                    "response larger than {} KiB",
                    MAX_BODY / 1024
                ))
            }
            Err(e) => return QueryOutcome::Unreachable(format!("reading the response: {e}")),
        };
        if status.is_server_error() && status != hyper::StatusCode::UNPROCESSABLE_ENTITY {
            // 503 while starting up, 5xx from a proxy in front: no answer yet.
            // (Prometheus itself answers 422/400 for a query it refuses.)
            return QueryOutcome::Unreachable(format!("HTTP {status}"));
        }
        parse_response(status.as_u16(), &body)
    }
}

/// `BASE/api/v1/query?query=…`, the query form-encoded.
pub fn query_url(base: &str, query: &str) -> String {
    let q: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("query", query)
        .finish();
    format!("{}/api/v1/query?{q}", base.trim_end_matches('/'))
}

#[derive(Deserialize)]
struct ApiResponse {
    status: String,
    #[serde(default)]
    data: Option<ApiData>,
    #[serde(default, rename = "errorType")]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct ApiData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct VectorSample {
    #[serde(default)]
    metric: std::collections::BTreeMap<String, String>,
    value: (serde_json::Value, String),
}

/// Reduces an API answer (HTTP status and body) to an outcome.
pub fn parse_response(status: u16, body: &[u8]) -> QueryOutcome {
    let parsed: ApiResponse = match serde_json::from_slice(body) {
        Ok(p) => p,
        Err(e) => {
            return QueryOutcome::Rejected(format!(
                "HTTP {status}: not a Prometheus API response ({e})"
            ))
        }
    };
    if parsed.status != "success" {
        return QueryOutcome::Rejected(format!(
            "HTTP {status}: {}: {}",
            parsed.error_type.as_deref().unwrap_or("error"),
            one_line(parsed.error.as_deref().unwrap_or("no error message"))
        ));
    }
    let Some(data) = parsed.data else {
        return QueryOutcome::Rejected("a success without data".to_owned());
    };
    if data.result_type != "vector" {
        return QueryOutcome::Rejected(format!(
            "the query returns a {}, not an instant vector; write one that returns a series \
             per problem, such as 'up == 0'",
            data.result_type
        ));
    }
    let samples: Vec<VectorSample> = match serde_json::from_value(data.result) {
        Ok(s) => s,
        Err(e) => return QueryOutcome::Rejected(format!("malformed vector result: {e}")),
    };
    let Some(first) = samples.first() else {
        return QueryOutcome::Clear;
    };
    let labels = first
        .metric
        .iter()
        .filter(|(k, _)| k.as_str() != "__name__")
        .map(|(k, v)| format!("{k}=\"{v}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let name = first.metric.get("__name__").map_or("", String::as_str);
    QueryOutcome::Firing {
        series: format!("{name}{{{labels}}}"),
        value: first.value.1.clone(),
        samples: samples.len(),
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

fn one_line(s: &str) -> String {
    let line: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    line.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_vector_is_clear_and_a_sample_fires_naming_it() {
        let empty = br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert_eq!(parse_response(200, empty), QueryOutcome::Clear);
        let one = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"errors","job":"app"},"value":[1700000000.1,"3"]},
            {"metric":{"job":"other"},"value":[1700000000.1,"1"]}]}}"#;
        assert_eq!(
            parse_response(200, one),
            QueryOutcome::Firing {
                series: "errors{job=\"app\"}".into(),
                value: "3".into(),
                samples: 2
            }
        );
    }

    #[test]
    fn errors_scalars_and_garbage_are_rejected_not_clear() {
        let bad = br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        assert!(
            matches!(parse_response(400, bad), QueryOutcome::Rejected(m) if m.contains("bad_data"))
        );
        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}"#;
        assert!(
            matches!(parse_response(200, scalar), QueryOutcome::Rejected(m) if m.contains("scalar"))
        );
        assert!(matches!(
            parse_response(200, b"<html>"),
            QueryOutcome::Rejected(_)
        ));
        let no_value =
            br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}"#;
        assert!(matches!(
            parse_response(200, no_value),
            QueryOutcome::Rejected(_)
        ));
    }

    #[test]
    fn the_query_is_form_encoded() {
        assert_eq!(
            query_url("http://p:9090/", "up{job=\"a b\"} == 0"),
            "http://p:9090/api/v1/query?query=up%7Bjob%3D%22a+b%22%7D+%3D%3D+0"
        );
    }
}
