//! OpenSSH `known_hosts` matching. Host keys are never trusted on first use:
//! a server whose key is not listed, or listed differently, is refused.

use ssh_key::PublicKey;

/// Result of looking a host key up.
#[derive(Debug, PartialEq, Eq)]
pub enum HostKeyCheck {
    /// The key is listed for the host.
    Known,
    /// The host is listed, but with other keys (the key changed, or a man in the middle).
    Changed,
    /// The host is not listed at all.
    Unknown,
    /// The key is listed as `@revoked`.
    Revoked,
}

/// Look up `key` (SSH wire-format blob, as the server sent it) for `host`:`port`.
///
/// Patterns: plain `host`, `[host]:port`, `*`/`?` wildcards, `!negation`,
/// and hashed `|1|salt|hash` entries. `@cert-authority` lines are ignored.
pub fn check(known_hosts: &str, host: &str, port: u16, key: &[u8]) -> HostKeyCheck {
    let Ok(offered) = PublicKey::from_bytes(key) else {
        return HostKeyCheck::Unknown;
    };
    let names: Vec<String> = if port == 22 {
        vec![host.to_string(), format!("[{host}]:22")]
    } else {
        vec![format!("[{host}]:{port}")]
    };
    let mut host_listed = false;
    let mut known = false;
    for line in known_hosts.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        let mut first = fields.next().unwrap_or("");
        let marker = if first.starts_with('@') {
            let m = first;
            first = fields.next().unwrap_or("");
            Some(m)
        } else {
            None
        };
        if marker == Some("@cert-authority") {
            continue;
        }
        if !patterns_match(first, &names) {
            continue;
        }
        let (Some(kt), Some(b64)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Ok(listed) = PublicKey::from_openssh(&format!("{kt} {b64}")) else {
            continue;
        };
        let same = listed.key_data() == offered.key_data();
        if marker == Some("@revoked") {
            if same {
                return HostKeyCheck::Revoked;
            }
            continue;
        }
        host_listed = true;
        known |= same;
    }
    match (known, host_listed) {
        (true, _) => HostKeyCheck::Known,
        (false, true) => HostKeyCheck::Changed,
        (false, false) => HostKeyCheck::Unknown,
    }
}

fn patterns_match(field: &str, names: &[String]) -> bool {
    if let Some(hashed) = field.strip_prefix("|1|") {
        return names.iter().any(|n| hashed_match(hashed, n));
    }
    let mut matched = false;
    for pat in field.split(',') {
        if let Some(neg) = pat.strip_prefix('!') {
            if names.iter().any(|n| glob(neg, n)) {
                return false;
            }
        } else if names.iter().any(|n| glob(pat, n)) {
            matched = true;
        }
    }
    matched
}

/// `|1|base64(salt)|base64(HMAC-SHA1(salt, name))`.
fn hashed_match(field: &str, name: &str) -> bool {
    let Some((salt, hash)) = field.split_once('|') else {
        return false;
    };
    let (Some(salt), Some(hash)) = (b64decode(salt), b64decode(hash)) else {
        return false;
    };
    hmac_sha1(&salt, name.as_bytes()).as_slice() == hash.as_slice()
}

fn glob(pat: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a.eq_ignore_ascii_case(b) => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    go(pat.as_bytes(), name.as_bytes())
}

fn b64decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

// Hashed known_hosts entries need HMAC-SHA1, which nothing else in drover
// uses; a few lines here avoid a dependency for it.
fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0];
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for chunk in msg.chunks(64) {
        let mut w = [0u32; 80];
        for i in 0..16 {
            w[i] = u32::from_be_bytes([
                chunk[4 * i],
                chunk[4 * i + 1],
                chunk[4 * i + 2],
                chunk[4 * i + 3],
            ]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A827999),
                20..=39 => (b ^ c ^ d, 0x6ED9EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1BBCDC),
                _ => (b ^ c ^ d, 0xCA62C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (i, v) in h.iter().enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&v.to_be_bytes());
    }
    out
}

fn hmac_sha1(key: &[u8], msg: &[u8]) -> [u8; 20] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..20].copy_from_slice(&sha1(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
    inner.extend_from_slice(msg);
    let mut outer: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
    outer.extend_from_slice(&sha1(&inner));
    sha1(&outer)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE2sEDRbhZZtK5AKpgLtm9mnrUxYuc1WtPXBOwjqFqsc";

    fn blob() -> Vec<u8> {
        PublicKey::from_openssh(KEY).unwrap().to_bytes().unwrap()
    }

    #[test]
    fn sha1_known_answer() {
        assert_eq!(
            hex::encode(sha1(b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
    }

    #[test]
    fn plain_bracketed_and_hashed_forms() {
        assert_eq!(
            check(&format!("example.org {KEY}"), "example.org", 22, &blob()),
            HostKeyCheck::Known
        );
        assert_eq!(
            check(
                &format!("[127.0.0.1]:2222 {KEY}"),
                "127.0.0.1",
                2222,
                &blob()
            ),
            HostKeyCheck::Known
        );
        assert_eq!(
            check(&format!("127.0.0.1 {KEY}"), "127.0.0.1", 2222, &blob()),
            HostKeyCheck::Unknown
        );
        assert_eq!(
            check(&format!("*.org,!bad.org {KEY}"), "bad.org", 22, &blob()),
            HostKeyCheck::Unknown
        );
        // Produced by `ssh-keygen -H` for "example.org".
        let salt = [7u8; 20];
        let mac = hmac_sha1(&salt, b"example.org");
        let enc = |b: &[u8]| {
            const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            let mut s = String::new();
            for c in b.chunks(3) {
                let n = (c[0] as u32) << 16
                    | (*c.get(1).unwrap_or(&0) as u32) << 8
                    | *c.get(2).unwrap_or(&0) as u32;
                for i in 0..=c.len() {
                    s.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
                }
            }
            s
        };
        let line = format!("|1|{}|{} {KEY}", enc(&salt), enc(&mac));
        assert_eq!(
            check(&line, "example.org", 22, &blob()),
            HostKeyCheck::Known
        );
        assert_eq!(
            check(&line, "other.org", 22, &blob()),
            HostKeyCheck::Unknown
        );
    }

    #[test]
    fn changed_and_revoked() {
        let other =
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";
        assert_eq!(
            check(&format!("h {other}"), "h", 22, &blob()),
            HostKeyCheck::Changed
        );
        assert_eq!(
            check(&format!("@revoked h {KEY}\nh {KEY}"), "h", 22, &blob()),
            HostKeyCheck::Revoked
        );
    }
}
