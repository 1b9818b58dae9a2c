//! Tenant tokens: the agent only ever holds their SHA-256 digests.

/// SHA-256 of `token`, lower-case hex (the form the region stores and sends).
pub fn token_digest(token: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = String::with_capacity(64);
    for b in d.as_ref() {
        out.push(char::from_digit((b >> 4) as u32, 16).unwrap_or('0'));
        out.push(char::from_digit((b & 15) as u32, 16).unwrap_or('0'));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn digest_is_lower_case_sha256_hex() {
        assert_eq!(
            super::token_digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
