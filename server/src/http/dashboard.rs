//! The dashboard at `/`, with single-page-app fallback (any path that is not a file gets
//! `index.html`): a Trunk build from a directory, or the build compiled into the binary (feature
//! `embedded-dashboard`, for `cargo install`); with neither, a page saying how to get one.

use std::path::Path;

use axum::Router;
use axum::response::Html;
use axum::routing::get;
use tower_http::services::{ServeDir, ServeFile};

/// Where a server run from a checkout finds the dashboard that `scripts/build-dashboard` built,
/// when `--dashboard-dir` names none.
pub const DEFAULT_DIR: &str = "web/dist";

/// The dashboard from `dir` when one is named; otherwise from [`DEFAULT_DIR`] if it holds a
/// build (a checkout), else the one compiled into the binary, if it was.
pub fn router(dir: Option<&Path>) -> Router {
    let named = dir.is_some();
    let dir = dir.unwrap_or(Path::new(DEFAULT_DIR));
    let index = dir.join("index.html");
    if index.is_file() {
        tracing::info!(dir = %dir.display(), "serving the dashboard");
        return Router::new().fallback_service(ServeDir::new(dir).fallback(ServeFile::new(index)));
    }
    if !named && let Some(router) = built_in() {
        tracing::info!("serving the dashboard built into the binary");
        return router;
    }
    tracing::warn!(dir = %dir.display(), "no dashboard build found; / explains how to build it");
    let page = format!(
        "<!doctype html><title>durable-mcp</title><h1>durable-mcp</h1>\
         <p>The MCP endpoint is at <code>/mcp</code>.</p>\
         <p>No dashboard build was found in <code>{}</code>. Build it with \
         <code>scripts/build-dashboard</code> (see the README), point \
         <code>--dashboard-dir</code> at one, or install the server with it built in: \
         <code>cargo install --path cli --features embedded-dashboard</code>.</p>",
        dir.display()
    );
    Router::new().fallback(get(move || async move { Html(page) }))
}

/// The dashboard compiled into the binary.
#[cfg(feature = "embedded-dashboard")]
fn built_in() -> Option<Router> {
    Some(embedded::router())
}

/// None: this binary was built without the `embedded-dashboard` feature.
#[cfg(not(feature = "embedded-dashboard"))]
fn built_in() -> Option<Router> {
    None
}

/// The build that `build.rs` made with Trunk, compiled in.
#[cfg(feature = "embedded-dashboard")]
mod embedded {
    use axum::Router;
    use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
    use axum::response::{IntoResponse, Response};
    use axum::routing::get;
    use rust_embed::Embed;

    #[derive(Embed)]
    #[folder = "$OUT_DIR/dashboard"]
    struct Dist;

    pub fn router() -> Router {
        Router::new().fallback_service(get(serve))
    }

    /// Serves the file at the request's path, or `index.html` for a path that is none (a
    /// client-side route), with its content type and an ETag from its hash.
    async fn serve(uri: Uri, headers: HeaderMap) -> Response {
        let path = uri.path().trim_start_matches('/');
        let Some(file) = Dist::get(path).or_else(|| Dist::get("index.html")) else {
            // build.rs refuses to finish without an index.html, so this is a broken build.
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the embedded dashboard has no index.html",
            )
                .into_response();
        };
        let etag = format!("\"{}\"", hex::encode(file.metadata.sha256_hash()));
        let etag = HeaderValue::from_str(&etag).expect("a hex digest in quotes is a header value");
        if headers.get(header::IF_NONE_MATCH) == Some(&etag) {
            return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
        }
        let content_type = HeaderValue::from_str(file.metadata.mimetype())
            .unwrap_or(HeaderValue::from_static("application/octet-stream"));
        (
            [(header::CONTENT_TYPE, content_type), (header::ETAG, etag)],
            file.data,
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use axum::body::Body;
    use axum::extract::Request;
    use tower::Service;

    use super::*;

    async fn page(mut router: Router, path: &str) -> String {
        poll_fn(|cx| Service::<Request>::poll_ready(&mut router, cx))
            .await
            .unwrap();
        let request = Request::get(path).body(Body::empty()).unwrap();
        let response = router.call(request).await.unwrap();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn a_build_in_the_named_directory_serves_every_client_side_route() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("index.html"), "the app").unwrap();
        std::fs::write(dir.path().join("app.js"), "code").unwrap();
        assert_eq!(page(router(Some(dir.path())), "/app.js").await, "code");
        assert_eq!(page(router(Some(dir.path())), "/").await, "the app");
        assert_eq!(
            page(router(Some(dir.path())), "/tasks/any").await,
            "the app"
        );
    }

    #[tokio::test]
    async fn a_named_directory_without_a_build_gets_the_page_saying_how_to_make_one() {
        let dir = tempfile::tempdir().unwrap();
        let text = page(router(Some(&dir.path().join("dist"))), "/").await;
        assert!(text.contains("No dashboard build was found"), "{text}");
        assert!(text.contains("scripts/build-dashboard"), "{text}");
    }
}
