//! Pieces of a CodaLab server stand-in (wiremock) for tests of one behaviour without the real
//! server: the real one is in [`crate::peers`].

use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

/// Answers the OAuth2 password grant (`POST /rest/oauth2/token`) with a bearer token valid for
/// an hour, whatever the credentials.
pub async fn token_endpoint(server: &MockServer) {
    Mock::given(method("POST"))
        .and(path("/rest/oauth2/token"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"access_token": "t", "token_type": "Bearer", "expires_in": 3600}),
        ))
        .mount(server)
        .await;
}
