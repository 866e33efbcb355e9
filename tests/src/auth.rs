//! A test authorization server: tokens minted with the test-only keys of `tests/fixtures/auth`
//! and the JWKS file a server under test trusts.

use std::path::{Path, PathBuf};

use jsonwebtoken::jwk::{Jwk, JwkSet};

use crate::{Client, Server};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

pub const ISSUER: &str = "https://issuer.test/realms/durable";
/// The resource identifier of the servers under test (their public URL, were they deployed).
pub const AUDIENCE: &str = "https://mcp.test/mcp";
pub const READ: &str = "tasks:read";
pub const WRITE: &str = "tasks:read tasks:write";
pub const OPERATOR: &str = "tasks:operator";

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/auth")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The keys: `ec` (ES256, kid "ec") and `rsa` (RS256, kid "rsa") are in the JWKS; `stranger`
/// (ES256) is not.
pub struct Issuer {
    ec: EncodingKey,
    rsa: EncodingKey,
    stranger: EncodingKey,
    pub jwks_file: PathBuf,
}

impl Issuer {
    /// The issuer, its JWKS written to `dir/jwks.json`.
    pub fn new(dir: &Path) -> Issuer {
        let ec = EncodingKey::from_ec_pem(&fixture("ec-a.pem")).expect("EC key");
        let rsa = EncodingKey::from_rsa_pem(&fixture("rsa.pem")).expect("RSA key");
        let stranger = EncodingKey::from_ec_pem(&fixture("ec-b.pem")).expect("EC key");
        let public = |key: &EncodingKey, alg: Algorithm, kid: &str| {
            let mut jwk = Jwk::from_encoding_key(key, alg).expect("public key");
            jwk.common.key_id = Some(kid.into());
            jwk
        };
        let jwks = JwkSet {
            keys: vec![
                public(&ec, Algorithm::ES256, "ec"),
                public(&rsa, Algorithm::RS256, "rsa"),
            ],
        };
        let jwks_file = dir.join("jwks.json");
        std::fs::write(&jwks_file, serde_json::to_string(&jwks).expect("JWKS")).expect("JWKS file");
        Issuer {
            ec,
            rsa,
            stranger,
            jwks_file,
        }
    }

    /// The server flags that make it trust this issuer.
    pub fn server_args(&self) -> Vec<String> {
        vec![
            "--auth-issuer".into(),
            ISSUER.into(),
            "--auth-audience".into(),
            AUDIENCE.into(),
            "--auth-jwks-file".into(),
            self.jwks_file.display().to_string(),
        ]
    }

    /// A server in `dir` that trusts this issuer, with `extra` flags.
    pub async fn start_server(&self, dir: &Path, extra: &[&str]) -> Server {
        let mut args = self.server_args();
        args.extend(extra.iter().map(|arg| arg.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Server::start(dir, &args).await
    }

    /// A client of `server` with the operator scope, which sees every subject's tasks.
    pub async fn operator(&self, server: &Server) -> Client {
        Client::connect_with_token(&server.mcp_url(), &self.token("olga", OPERATOR)).await
    }

    /// Valid claims for `subject` with `scope`, valid for five minutes.
    pub fn claims(subject: &str, scope: &str) -> Value {
        let now = jsonwebtoken::get_current_timestamp();
        json!({"iss": ISSUER, "aud": AUDIENCE, "sub": subject, "scope": scope,
               "iat": now, "exp": now + 300})
    }

    /// A valid ES256 token for `subject` with `scope`.
    pub fn token(&self, subject: &str, scope: &str) -> String {
        self.sign_ec("ec", &Issuer::claims(subject, scope))
    }

    /// `claims` signed with the JWKS's EC key under key id `kid`.
    pub fn sign_ec(&self, kid: &str, claims: &Value) -> String {
        sign(Algorithm::ES256, kid, claims, &self.ec)
    }

    /// `claims` signed with the JWKS's RSA key.
    pub fn sign_rsa(&self, claims: &Value) -> String {
        sign(Algorithm::RS256, "rsa", claims, &self.rsa)
    }

    /// `claims` signed with a key the JWKS does not hold, under key id `kid`.
    pub fn sign_stranger(&self, kid: &str, claims: &Value) -> String {
        sign(Algorithm::ES256, kid, claims, &self.stranger)
    }
}

fn sign(alg: Algorithm, kid: &str, claims: &Value, key: &EncodingKey) -> String {
    let mut header = Header::new(alg);
    header.kid = Some(kid.into());
    jsonwebtoken::encode(&header, claims, key).expect("signing a token")
}
