//! Test certificates made with the `openssl` command: a CA and a certificate it signed for
//! localhost / 127.0.0.1, usable by a server and by a client.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA and one certificate it signed, as PEM files.
pub struct Certs {
    /// The CA's certificate.
    pub ca: PathBuf,
    /// The signed certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (the TLS tests need the openssl command)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes `<name>-ca.pem` and `<name>.pem` / `<name>.key` in `dir`.
pub fn make(dir: &Path, name: &str) -> Certs {
    let (ca_key, ca) = (format!("{name}-ca.key"), format!("{name}-ca.pem"));
    let (key, csr, cert, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
        format!("{name}-ext.cnf"),
    );
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=pgvs3 test CA",
            "-keyout",
            &ca_key,
            "-out",
            &ca,
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            &key,
            "-out",
            &csr,
        ],
    );
    std::fs::write(
        dir.join(&ext),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .expect("write the extensions");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &cert,
        ],
    );
    Certs {
        ca: dir.join(ca),
        cert: dir.join(cert),
        key: dir.join(key),
    }
}
