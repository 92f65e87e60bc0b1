//! The cluster's certificates, made with Debian's openssl: one CA, the API server's serving
//! certificate (its SANs include the `kubernetes` Service's ClusterIP, which pods dial), client
//! certificates whose subject is the identity (`O` = groups, `CN` = user, as the API server's
//! x509 authenticator reads them), and the service-account signing key. P-256 keys: quick to
//! make on a slow machine.

use std::{fs, path::Path, process::Command};

use anyhow::Result;

use crate::apt;

/// A client certificate's identity.
pub struct Identity<'a> {
    pub file: &'a str,
    pub user: &'a str,
    pub group: Option<&'a str>,
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    apt::run(
        Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    )
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

pub fn ca(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir)?;
    let mut args = vec!["req", "-x509", "-nodes", "-days", "3650"];
    args.extend(EC);
    args.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=qoslet-cluster-ca",
    ]);
    openssl(dir, &args)
}

/// A certificate signed by the CA in `dir`: `sans` makes it a serving certificate too.
pub fn leaf(dir: &Path, id: &Identity, sans: &[String]) -> Result<()> {
    let subject = match id.group {
        Some(g) => format!("/O={g}/CN={}", id.user),
        None => format!("/CN={}", id.user),
    };
    let (key, csr, crt, ext) = (
        format!("{}.key", id.file),
        format!("{}.csr", id.file),
        format!("{}.crt", id.file),
        format!("{}.ext", id.file),
    );
    let mut args = vec!["req", "-new", "-nodes"];
    args.extend(EC);
    args.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
    openssl(dir, &args)?;
    let mut extensions = String::from(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth,serverAuth\n",
    );
    if !sans.is_empty() {
        extensions.push_str(&format!("subjectAltName={}\n", sans.join(",")));
    }
    fs::write(dir.join(&ext), extensions)?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            &serial(),
            "-days",
            "3650",
            "-out",
            &crt,
            "-extfile",
            &ext,
        ],
    )?;
    let _ = fs::remove_file(dir.join(csr));
    let _ = fs::remove_file(dir.join(ext));
    Ok(())
}

/// The service-account token signing key pair (`sa.key`, `sa.pub`).
pub fn service_account_key(dir: &Path) -> Result<()> {
    openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            "sa.key",
        ],
    )?;
    openssl(dir, &["pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"])
}

/// A serial number unique among the CA's certificates (nanoseconds since the epoch).
fn serial() -> String {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{ns}")
}
