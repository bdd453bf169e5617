//! Identities of their own against the test control plane: a client
//! certificate signed by its CA, for a user in groups of the test's choice
//! (a node's kubelet is `system:node:<name>` in `system:nodes`, limited by
//! the Node authorizer and NodeRestriction as in a real cluster).

use super::kube::{client_from, ControlPlane};
use kube::Client;
use std::process::Command;

impl ControlPlane {
    /// A client of an identity of its own, by a client certificate the
    /// control plane's CA signs now (`openssl`): user `user` in `groups`, as
    /// a kubelet's `system:node:NAME` in `system:nodes` is. Its key, its
    /// certificate and its kubeconfig are written under `DIR/identities/`.
    pub async fn client_as_certificate(&self, user: &str, groups: &[&str]) -> Client {
        let dir = self.dir().join("identities");
        std::fs::create_dir_all(&dir).unwrap();
        let file: String = user
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let (key, csr, crt) = (
            dir.join(format!("{file}.key")),
            dir.join(format!("{file}.csr")),
            dir.join(format!("{file}.crt")),
        );
        let subject: String = groups
            .iter()
            .map(|g| format!("/O={g}"))
            .chain([format!("/CN={user}")])
            .collect();
        let ext = dir.join(format!("{file}.ext"));
        std::fs::write(&ext, "extendedKeyUsage=clientAuth\n").unwrap();
        let pki = self.dir().join("pki");
        for args in [
            vec![
                "req",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                key.to_str().unwrap(),
                "-subj",
                &subject,
                "-out",
                csr.to_str().unwrap(),
            ],
            vec![
                "x509",
                "-req",
                "-in",
                csr.to_str().unwrap(),
                "-CA",
                pki.join("ca.crt").to_str().unwrap(),
                "-CAkey",
                pki.join("ca.key").to_str().unwrap(),
                "-set_serial",
                &rand::random::<u32>().to_string(),
                "-days",
                "1",
                "-extfile",
                ext.to_str().unwrap(),
                "-out",
                crt.to_str().unwrap(),
            ],
        ] {
            let out = Command::new("openssl")
                .args(&args)
                .output()
                .expect("openssl runs");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // The admin kubeconfig, its user swapped for this certificate.
        let mut kc: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(self.kubeconfig_path()).unwrap())
                .unwrap();
        kc["users"][0]["user"] = serde_yaml::to_value(std::collections::BTreeMap::from([
            ("client-certificate", crt.to_str().unwrap()),
            ("client-key", key.to_str().unwrap()),
        ]))
        .unwrap();
        let path = dir.join(format!("{file}.kubeconfig"));
        std::fs::write(&path, serde_yaml::to_string(&kc).unwrap()).unwrap();
        client_from(&path)
            .await
            .expect("a client of the certificate")
    }
}
