//! The OAuth 2.1 resource server: who a request comes from, when `--auth-issuer` is set.
//!
//! A request to `/mcp` carries `Authorization: Bearer <JWT>`, issued by the configured
//! authorization server for this resource (RFC 8707: the token's `aud` names this server).
//! [`Verifier`] checks its signature against the issuer's JWKS (asymmetric algorithms only: RS*,
//! PS*, ES*, EdDSA; `alg: none` and HMAC never verify), `iss`, `aud`, `exp` and `nbf` (with
//! [`LEEWAY`]), and turns it into a [`Principal`]: the subject that owns what it creates, and its
//! scopes. The HTTP side (challenges, RFC 9728 metadata) is `http::authorize`.
//!
//! JWT decoding and signature checks are `jsonwebtoken`'s (the most used Rust JWT crate, kept up
//! by its author for years; its RustCrypto backend needs no C toolchain). What no crate does for
//! a resource server is written here: the JWKS cache, refreshed when a token names a key it does
//! not hold (a rotated key is picked up at once), at most once per [`REFRESH_EVERY`] so that
//! tokens with made-up key ids cannot make the server hammer the issuer.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use jsonwebtoken::jwk::{Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

/// Reading and steering one's own tasks; every request needs it (or a wider scope).
pub const SCOPE_READ: &str = "tasks:read";
/// Starting tasks and steering (pause, resume, cancel) one's own.
pub const SCOPE_WRITE: &str = "tasks:write";
/// Seeing and steering every subject's tasks.
pub const SCOPE_OPERATOR: &str = "tasks:operator";
/// The scopes this server knows, as its metadata lists them.
pub const SCOPES: [&str; 3] = [SCOPE_READ, SCOPE_WRITE, SCOPE_OPERATOR];

/// Largest JWKS document accepted.
const MAX_JWKS_BYTES: usize = 1 << 20;

/// Clock skew tolerated on `exp` and `nbf`.
pub const LEEWAY: Duration = Duration::from_secs(30);
/// Least time between two JWKS reloads caused by unknown key ids.
pub const REFRESH_EVERY: Duration = Duration::from_secs(30);
/// How long fetching a JWKS over HTTP may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the issuer's signing keys come from.
#[derive(Debug, Clone, PartialEq)]
pub enum JwksSource {
    /// A JWKS document on disk (air-gapped use); re-read when a token names an unknown key.
    File(PathBuf),
    /// The issuer's `jwks_uri`.
    Url(String),
}

/// The authorization settings (`--auth-*`).
#[derive(Debug, Clone, PartialEq)]
pub struct AuthConfig {
    /// The authorization server; tokens must carry exactly this `iss`.
    pub issuer: String,
    /// This resource's identifier; tokens must list it in `aud`. When it is an http(s) URL it
    /// also locates the metadata document.
    pub audience: String,
    pub jwks: JwksSource,
}

/// What a request may do, from its token's scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes {
    pub read: bool,
    pub write: bool,
    pub operator: bool,
}

impl Scopes {
    /// From the space-separated `scope` claim (RFC 8693) and/or the `scp` list some issuers use.
    fn parse<'a>(granted: impl Iterator<Item = &'a str>) -> Scopes {
        let mut scopes = Scopes::default();
        for scope in granted {
            match scope {
                SCOPE_READ => scopes.read = true,
                SCOPE_WRITE => scopes.write = true,
                SCOPE_OPERATOR => scopes.operator = true,
                _ => {}
            }
        }
        scopes
    }

    /// May use the server at all: read one's own tasks.
    pub fn may_read(self) -> bool {
        self.read || self.write || self.operator
    }

    /// May start tasks and steer them.
    pub fn may_write(self) -> bool {
        self.write || self.operator
    }
}

/// The authenticated caller of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Principal {
    /// The token's `sub`: the owner of every task, session and file it creates.
    pub subject: String,
    pub scopes: Scopes,
}

/// Why a token was refused; the message goes to the client as `error_description`.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{0}")]
pub struct InvalidToken(pub String);

#[derive(Debug, Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    scope: Option<String>,
    #[serde(default)]
    scp: Option<Vec<String>>,
}

/// Checks bearer tokens against the issuer's keys. Cheap to share.
pub struct Verifier {
    config: AuthConfig,
    keys: RwLock<JwkSet>,
    /// When the keys were last loaded; held across a reload so that concurrent unknown-key
    /// tokens wait for one reload instead of starting one each.
    loaded: tokio::sync::Mutex<Instant>,
    http: HttpClient,
}

type HttpClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    http_body_util::Empty<bytes::Bytes>,
>;

impl Verifier {
    /// Loads the issuer's keys; a server that cannot get them does not start.
    pub async fn load(config: AuthConfig) -> anyhow::Result<Arc<Verifier>> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(Arc::new(rustls::crypto::ring::default_provider()))
            .context("loading the system's CA certificates for https JWKS URLs")?
            .https_or_http()
            .enable_http1()
            .build();
        let http =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(https);
        let keys = fetch(&http, &config.jwks).await?;
        if keys.keys.is_empty() {
            anyhow::bail!("the JWKS at {} holds no keys", describe(&config.jwks));
        }
        Ok(Arc::new(Verifier {
            config,
            keys: RwLock::new(keys),
            loaded: tokio::sync::Mutex::new(Instant::now()),
            http,
        }))
    }

    pub fn config(&self) -> &AuthConfig {
        &self.config
    }

    /// The principal of a valid token, or why it is not valid.
    pub async fn verify(&self, token: &str) -> Result<Principal, InvalidToken> {
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| InvalidToken(format!("the token is not a signed JWT: {e}")))?;
        let alg = header.alg;
        if !asymmetric(alg) {
            return Err(InvalidToken(format!(
                "tokens signed with {alg:?} are not accepted; the issuer's keys are asymmetric"
            )));
        }
        let key = match self.key_for(header.kid.as_deref(), alg)? {
            Some(key) => key,
            None => {
                self.reload_for_unknown_key().await;
                self.key_for(header.kid.as_deref(), alg)?.ok_or_else(|| {
                    InvalidToken(match &header.kid {
                        Some(kid) => {
                            format!("the token's key id {kid:?} is not one of the issuer's keys")
                        }
                        None => {
                            "the token names no key id (kid) and the issuer has several keys".into()
                        }
                    })
                })?
            }
        };
        let mut validation = Validation::new(alg);
        validation.leeway = LEEWAY.as_secs();
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let claims = jsonwebtoken::decode::<Claims>(token, &key, &validation)
            .map_err(|e| InvalidToken(refusal(&e)))?
            .claims;
        if claims.sub.trim().is_empty() {
            return Err(InvalidToken("the token's subject (sub) is empty".into()));
        }
        let granted = claims
            .scope
            .iter()
            .flat_map(|scope| scope.split_whitespace())
            .chain(claims.scp.iter().flatten().map(String::as_str));
        Ok(Principal {
            scopes: Scopes::parse(granted),
            subject: claims.sub,
        })
    }

    /// The key a token with `kid` and `alg` is checked with; `None` when the keys held do not
    /// include it (a reload may find it).
    fn key_for(
        &self,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<Option<DecodingKey>, InvalidToken> {
        let keys = self.keys.read().expect("JWKS lock");
        let jwk = match kid {
            Some(kid) => keys.find(kid),
            None => {
                let usable: Vec<&Jwk> = keys.keys.iter().filter(|jwk| fits(jwk, alg)).collect();
                match usable[..] {
                    [only] => Some(only),
                    _ => None,
                }
            }
        };
        let Some(jwk) = jwk else {
            return Ok(None);
        };
        if !fits(jwk, alg) {
            return Err(InvalidToken(format!(
                "the token is signed with {alg:?}, which its key does not use"
            )));
        }
        DecodingKey::from_jwk(jwk)
            .map(Some)
            .map_err(|e| InvalidToken(format!("the issuer's key cannot verify tokens: {e}")))
    }

    /// Loads the keys again unless that was done less than [`REFRESH_EVERY`] ago.
    async fn reload_for_unknown_key(&self) {
        let mut loaded = self.loaded.lock().await;
        if loaded.elapsed() < REFRESH_EVERY {
            return;
        }
        *loaded = Instant::now();
        match fetch(&self.http, &self.config.jwks).await {
            Ok(keys) if !keys.keys.is_empty() => {
                tracing::info!(keys = keys.keys.len(), "reloaded the issuer's keys");
                *self.keys.write().expect("JWKS lock") = keys;
            }
            Ok(_) => tracing::warn!("the reloaded JWKS holds no keys; keeping the old ones"),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "cannot reload the JWKS; keeping the old keys")
            }
        }
    }
}

/// Whether `jwk` may check a token signed with `alg`: its declared algorithm, if any, is `alg`,
/// and its key type is `alg`'s.
fn fits(jwk: &Jwk, alg: Algorithm) -> bool {
    use jsonwebtoken::jwk::AlgorithmParameters as Params;
    let declared = jwk
        .common
        .key_algorithm
        .is_none_or(|declared| key_algorithm(alg) == Some(declared));
    let family = matches!(
        (&jwk.algorithm, alg),
        (
            Params::RSA(_),
            Algorithm::RS256
                | Algorithm::RS384
                | Algorithm::RS512
                | Algorithm::PS256
                | Algorithm::PS384
                | Algorithm::PS512
        ) | (
            Params::EllipticCurve(_),
            Algorithm::ES256 | Algorithm::ES384
        ) | (Params::OctetKeyPair(_), Algorithm::EdDSA)
    );
    declared && family
}

fn key_algorithm(alg: Algorithm) -> Option<KeyAlgorithm> {
    Some(match alg {
        Algorithm::RS256 => KeyAlgorithm::RS256,
        Algorithm::RS384 => KeyAlgorithm::RS384,
        Algorithm::RS512 => KeyAlgorithm::RS512,
        Algorithm::PS256 => KeyAlgorithm::PS256,
        Algorithm::PS384 => KeyAlgorithm::PS384,
        Algorithm::PS512 => KeyAlgorithm::PS512,
        Algorithm::ES256 => KeyAlgorithm::ES256,
        Algorithm::ES384 => KeyAlgorithm::ES384,
        Algorithm::EdDSA => KeyAlgorithm::EdDSA,
        _ => return None,
    })
}

fn asymmetric(alg: Algorithm) -> bool {
    !matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
}

/// What a client is told about a token that failed validation.
fn refusal(error: &jsonwebtoken::errors::Error) -> String {
    use jsonwebtoken::errors::ErrorKind;
    match error.kind() {
        ErrorKind::ExpiredSignature => "the token has expired".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        ErrorKind::InvalidAudience => {
            "the token is for another resource (aud does not name this server)".into()
        }
        ErrorKind::InvalidIssuer => "the token comes from another issuer (iss)".into(),
        ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
        ErrorKind::MissingRequiredClaim(claim) => format!("the token has no {claim} claim"),
        other => format!("the token is not valid: {other:?}"),
    }
}

fn describe(source: &JwksSource) -> String {
    match source {
        JwksSource::File(path) => path.display().to_string(),
        JwksSource::Url(url) => url.clone(),
    }
}

async fn fetch(http: &HttpClient, source: &JwksSource) -> anyhow::Result<JwkSet> {
    let text = match source {
        JwksSource::File(path) => tokio::fs::read_to_string(path)
            .await
            .with_context(|| format!("reading the JWKS file {}", path.display()))?,
        JwksSource::Url(url) => tokio::time::timeout(FETCH_TIMEOUT, get(http, url))
            .await
            .map_err(|_| anyhow::anyhow!("no answer within {FETCH_TIMEOUT:?}"))
            .and_then(|fetched| fetched)
            .with_context(|| format!("fetching the JWKS from {url}"))?,
    };
    let set: JwkSet = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JWKS document", describe(source)))?;
    // Keys of algorithms this server never accepts (HMAC secrets above all) are dropped, so a
    // JWKS that mixes them in cannot open the door to an algorithm confusion.
    let mut seen = HashSet::new();
    let keys = set
        .keys
        .into_iter()
        .filter(|jwk| {
            !matches!(
                jwk.algorithm,
                jsonwebtoken::jwk::AlgorithmParameters::OctetKey(_)
            )
        })
        .filter(|jwk| {
            jwk.common
                .key_id
                .as_ref()
                .is_none_or(|kid| seen.insert(kid.clone()))
        })
        .collect();
    Ok(JwkSet { keys })
}

/// The body of a successful GET of `url`.
async fn get(http: &HttpClient, url: &str) -> anyhow::Result<String> {
    use http_body_util::BodyExt;
    let uri: axum::http::Uri = url.parse().context("not a URL")?;
    let response = http.get(uri).await?;
    if !response.status().is_success() {
        anyhow::bail!("HTTP {}", response.status());
    }
    let body = http_body_util::Limited::new(response.into_body(), MAX_JWKS_BYTES)
        .collect()
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .to_bytes();
    Ok(String::from_utf8(body.to_vec())?)
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::{Value, json};

    use super::*;

    const ISSUER: &str = "https://issuer.test";
    const AUDIENCE: &str = "http://127.0.0.1/mcp";

    /// The test-only keys of `tests/fixtures/auth`.
    fn ec_key(name: &str) -> EncodingKey {
        let pem = match name {
            "a" => include_bytes!("../../tests/fixtures/auth/ec-a.pem").as_slice(),
            _ => include_bytes!("../../tests/fixtures/auth/ec-b.pem").as_slice(),
        };
        EncodingKey::from_ec_pem(pem).unwrap()
    }

    async fn verifier(keys: &[(&str, &EncodingKey)], dir: &tempfile::TempDir) -> Arc<Verifier> {
        let path = dir.path().join("jwks.json");
        write_jwks(&path, keys);
        Verifier::load(AuthConfig {
            issuer: ISSUER.into(),
            audience: AUDIENCE.into(),
            jwks: JwksSource::File(path),
        })
        .await
        .unwrap()
    }

    fn write_jwks(path: &std::path::Path, keys: &[(&str, &EncodingKey)]) {
        let keys: Vec<Value> = keys
            .iter()
            .map(|(kid, key)| {
                let mut jwk =
                    serde_json::to_value(Jwk::from_encoding_key(key, Algorithm::ES256).unwrap())
                        .unwrap();
                jwk["kid"] = json!(kid);
                jwk
            })
            .collect();
        std::fs::write(path, json!({ "keys": keys }).to_string()).unwrap();
    }

    fn token(kid: &str, key: &EncodingKey, claims: Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.into());
        jsonwebtoken::encode(&header, &claims, key).unwrap()
    }

    fn claims(extra: Value) -> Value {
        let now = jsonwebtoken::get_current_timestamp();
        let mut claims = json!({"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": now + 300, "scope": "tasks:read tasks:write"});
        for (key, value) in extra.as_object().unwrap() {
            claims[key] = value.clone();
        }
        claims
    }

    #[tokio::test]
    async fn a_rotated_key_is_found_by_reloading_once_per_interval() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (ec_key("a"), ec_key("b"));
        let verifier = verifier(&[("old", &old)], &dir).await;
        let principal = verifier
            .verify(&token("old", &old, claims(json!({}))))
            .await
            .unwrap();
        assert_eq!(principal.subject, "alice");
        assert!(principal.scopes.may_write() && !principal.scopes.operator);

        write_jwks(&dir.path().join("jwks.json"), &[("new", &new)]);
        // Loaded just now: an unknown kid does not reload yet.
        let early = verifier
            .verify(&token("new", &new, claims(json!({}))))
            .await;
        assert!(
            early
                .unwrap_err()
                .0
                .contains("not one of the issuer's keys")
        );
        *verifier.loaded.lock().await -= REFRESH_EVERY;
        let principal = verifier
            .verify(&token(
                "new",
                &new,
                claims(json!({"scp": ["tasks:operator"], "scope": null})),
            ))
            .await
            .unwrap();
        assert!(principal.scopes.operator);
    }

    #[tokio::test]
    async fn claims_are_checked_one_by_one() {
        let dir = tempfile::tempdir().unwrap();
        let key = ec_key("a");
        let verifier = verifier(&[("k", &key)], &dir).await;
        let now = jsonwebtoken::get_current_timestamp();
        let cases = [
            (json!({"aud": "https://other/mcp"}), "another resource"),
            (json!({"iss": "https://evil.test"}), "another issuer"),
            (json!({"exp": now - 120}), "expired"),
            (json!({"nbf": now + 120}), "not valid yet"),
            (json!({"sub": ""}), "subject (sub) is empty"),
        ];
        for (extra, expected) in cases {
            let refused = verifier
                .verify(&token("k", &key, claims(extra.clone())))
                .await;
            assert!(
                refused.as_ref().unwrap_err().0.contains(expected),
                "{extra}: {refused:?}"
            );
        }
        let forged = token("k", &ec_key("b"), claims(json!({})));
        assert!(
            verifier
                .verify(&forged)
                .await
                .unwrap_err()
                .0
                .contains("signature")
        );
        let mut unsigned = token("k", &key, claims(json!({})));
        let header = base64_url(r#"{"alg":"none","kid":"k"}"#);
        unsigned = format!("{header}.{}.", unsigned.split('.').nth(1).unwrap());
        assert!(
            verifier
                .verify(&unsigned)
                .await
                .unwrap_err()
                .0
                .contains("not a signed JWT")
        );
        let hmac = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims(json!({})),
            &EncodingKey::from_secret(b"s").unwrap(),
        )
        .unwrap();
        assert!(
            verifier
                .verify(&hmac)
                .await
                .unwrap_err()
                .0
                .contains("HS256")
        );
        assert!(verifier.verify("garbage").await.is_err());
    }

    fn base64_url(text: &str) -> String {
        use base64::Engine;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
    }

    /// Serves the file at `path` as `/jwks`, read at every request (so it can be rotated).
    async fn serve_jwks(path: std::path::PathBuf) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                let path = path.clone();
                async move { std::fs::read_to_string(path).unwrap() }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{address}/jwks")
    }

    #[tokio::test]
    async fn keys_come_from_the_issuers_url_and_a_new_key_is_fetched_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        let (old, new) = (ec_key("a"), ec_key("b"));
        write_jwks(&path, &[("old", &old)]);
        let url = serve_jwks(path.clone()).await;
        let config = |url: String| AuthConfig {
            issuer: ISSUER.into(),
            audience: AUDIENCE.into(),
            jwks: JwksSource::Url(url),
        };
        let verifier = Verifier::load(config(url.clone())).await.unwrap();
        let claims = claims(json!({}));
        assert!(
            verifier
                .verify(&token("old", &old, claims.clone()))
                .await
                .is_ok()
        );
        write_jwks(&path, &[("new", &new)]);
        *verifier.loaded.lock().await -= REFRESH_EVERY;
        assert!(verifier.verify(&token("new", &new, claims)).await.is_ok());

        let unreachable = Verifier::load(config("http://127.0.0.1:9/jwks".into())).await;
        let error = format!("{:#}", unreachable.err().expect("no keys, no start"));
        assert!(error.contains("http://127.0.0.1:9/jwks"), "{error}");
    }
}
