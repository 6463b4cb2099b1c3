//! What the metrics server answers to a request head: `/metrics` (any query
//! string, as Prometheus's `params:` adds one) and `/healthz`, read-only.
//!
//! The request body is never read: a client that sent one gets its answer
//! with `Connection: close`, so hyper drops the connection instead of
//! draining a body of any declared length.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Body;
use hyper::header::{HeaderValue, ALLOW, CONNECTION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};

use super::Metrics;

/// The content type `prometheus-client`'s text encoder writes.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// The answer to `req`, built from its head alone.
pub(super) fn respond<B: Body>(req: &Request<B>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let mut response = route(req.method(), req.uri().path(), metrics);
    if !req.body().is_end_stream() {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

fn route(method: &Method, path: &str, metrics: &Metrics) -> Response<Full<Bytes>> {
    // HEAD is GET without the body; hyper leaves the body out itself.
    if method != Method::GET && method != Method::HEAD {
        let mut r = answer(StatusCode::METHOD_NOT_ALLOWED, TEXT, "eim: only GET\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    match path {
        "/metrics" => answer(StatusCode::OK, OPENMETRICS, metrics.render()),
        "/healthz" => answer(StatusCode::OK, TEXT, "ok\n"),
        _ => answer(
            StatusCode::NOT_FOUND,
            TEXT,
            "eim: metrics are at /metrics, health at /healthz\n",
        ),
    }
}

fn answer(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Empty};

    use super::*;

    fn get(uri: &str) -> Request<Empty<Bytes>> {
        Request::get(uri).body(Empty::new()).expect("request")
    }

    fn body(r: Response<Full<Bytes>>) -> String {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let bytes = rt
            .block_on(r.into_body().collect())
            .expect("infallible")
            .to_bytes();
        String::from_utf8(bytes.to_vec()).expect("UTF-8 body")
    }

    fn metrics_with_tracked(processes: i64) -> Metrics {
        let m = Metrics::new();
        m.processes.set(processes);
        m
    }

    #[test]
    fn metrics_are_served_with_any_query_string() {
        let m = metrics_with_tracked(7);
        for uri in [
            "/metrics",
            "/metrics?a=b",
            "/metrics?module=x&target=y",
            "/metrics?",
        ] {
            let r = respond(&get(uri), &m);
            assert_eq!(r.status(), StatusCode::OK, "{uri}");
            assert_eq!(r.headers()[CONTENT_TYPE], OPENMETRICS, "{uri}");
            assert!(r.headers().get(CONNECTION).is_none(), "{uri}");
            let text = body(r);
            assert!(
                text.contains("\neim_processes_tracked 7\n"),
                "{uri}: {text}"
            );
            assert!(text.ends_with("# EOF\n"), "{uri}: {text}");
        }
    }

    #[test]
    fn healthz_is_ok_and_short() {
        let r = respond(&get("/healthz?verbose=1"), &Metrics::new());
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(body(r), "ok\n");
    }

    #[test]
    fn other_paths_are_not_found() {
        let m = Metrics::new();
        for uri in [
            "/",
            "/metric",
            "/metrics/",
            "/metricsx",
            "/healthz/x",
            "/METRICS",
        ] {
            assert_eq!(
                respond(&get(uri), &m).status(),
                StatusCode::NOT_FOUND,
                "{uri}"
            );
        }
    }

    #[test]
    fn head_is_allowed_and_other_methods_are_refused() {
        let m = Metrics::new();
        let head = Request::head("/metrics")
            .body(Empty::<Bytes>::new())
            .expect("request");
        assert_eq!(respond(&head, &m).status(), StatusCode::OK);
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::OPTIONS] {
            let req = Request::builder()
                .method(method.clone())
                .uri("/metrics")
                .body(Empty::<Bytes>::new())
                .expect("request");
            let r = respond(&req, &m);
            assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED, "{method}");
            assert_eq!(r.headers()[ALLOW], "GET, HEAD", "{method}");
        }
    }

    #[test]
    fn a_request_with_a_body_closes_the_connection() {
        let m = Metrics::new();
        for method in [Method::GET, Method::POST] {
            let req = Request::builder()
                .method(method.clone())
                .uri("/metrics")
                .body(Full::new(Bytes::from_static(b"abc")))
                .expect("request");
            let r = respond(&req, &m);
            assert_eq!(r.headers()[CONNECTION], "close", "{method}");
        }
    }
}
