//! Smoke tests of the storage emulators in `tests/support/services.rs`, and of
//! what `object_store` can do against each of them.
//!
//! Run with `./scripts/test.sh --test services_smoke -- --nocapture` to see the
//! per-operation report of the `object_store_*` tests.

use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutPayload, RetryConfig,
};
use rhc_testkit::http::{http_request, try_http_request};
use rhc_testkit::services::{Azurite, FakeGcs, GcsEmu, MotoS3};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Few, fast retries so a failing operation reports quickly.
fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
            base: 2.0,
        },
        max_retries: 2,
        retry_timeout: Duration::from_secs(10),
    }
}

fn client_options() -> ClientOptions {
    ClientOptions::new()
        .with_allow_http(true)
        .with_timeout(Duration::from_secs(20))
        .with_connect_timeout(Duration::from_secs(5))
}

// ------------------------------------------------------------------ servers

#[test]
fn moto_starts_creates_buckets_and_survives_restart() {
    let Some(mut s3) = MotoS3::start() else {
        return;
    };
    assert!(s3.endpoint.starts_with("http://127.0.0.1:"));
    s3.create_bucket("smoke-bucket");
    // Creating it again is fine (and it is remembered once).
    s3.create_bucket("smoke-bucket");

    s3.put_object("smoke-bucket", "dir/hello world.txt", b"hello");
    assert_eq!(
        s3.get_object("smoke-bucket", "dir/hello world.txt")
            .as_deref(),
        Some(&b"hello"[..])
    );
    assert_eq!(
        s3.list_keys("smoke-bucket", "dir/"),
        ["dir/hello world.txt"]
    );
    assert_eq!(s3.get_object("smoke-bucket", "missing"), None);

    let port = s3.port;
    s3.stop();
    assert!(!s3.is_running());
    assert!(
        try_http_request("GET", &format!("{}/", s3.endpoint), &[], b"").is_err(),
        "moto still answers after stop()"
    );

    s3.restart();
    assert!(s3.is_running());
    assert_eq!(s3.port, port);
    assert_eq!(s3.endpoint, format!("http://127.0.0.1:{port}"));
    // The bucket is back (empty: moto keeps state in memory only).
    let (status, body) = http_request("GET", &format!("{}/", s3.endpoint), &[], b"");
    assert_eq!(status, 200);
    assert!(
        String::from_utf8_lossy(&body).contains("<Name>smoke-bucket</Name>"),
        "bucket list after restart: {}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(s3.get_object("smoke-bucket", "dir/hello world.txt"), None);
    assert!(s3.list_keys("smoke-bucket", "").is_empty());

    // restart() on a running server works too.
    s3.restart();
    let (status, _) = http_request("HEAD", &format!("{}/smoke-bucket", s3.endpoint), &[], b"");
    assert_eq!(status, 200);
}

#[test]
fn azurite_starts_and_creates_containers() {
    let Some(mut az) = Azurite::start() else {
        return;
    };
    assert_eq!(
        az.blob_endpoint,
        format!("http://127.0.0.1:{}/devstoreaccount1", az.port)
    );
    assert!(az
        .connection_string()
        .contains("AccountName=devstoreaccount1;"));
    az.create_container("smoke");
    // Creating it again is fine.
    az.create_container("smoke");
    // Unauthenticated requests are refused, so the server checks signatures.
    let (status, _) = http_request("GET", &format!("{}?comp=list", az.blob_endpoint), &[], b"");
    assert_eq!(status, 403);
    assert!(
        az.log()
            .contains("PUT /devstoreaccount1/smoke?restype=container"),
        "{}",
        az.log()
    );

    let port = az.port;
    az.stop();
    assert!(!az.is_running());
    az.restart();
    assert!(az.is_running());
    assert_eq!(az.port, port);
    // Re-created on restart: the log has a second successful container PUT.
    let created = az
        .log()
        .matches("PUT /devstoreaccount1/smoke?restype=container HTTP/1.1\" 201")
        .count();
    assert_eq!(created, 2, "{}", az.log());
}

#[test]
fn fake_gcs_starts_and_serves_objects() {
    let Some(gcs) = FakeGcs::start() else {
        return;
    };
    gcs.create_bucket("smoke");
    gcs.put_object("smoke", "dir/a b.txt", b"hello gcs");
    let (status, body) = http_request(
        "GET",
        &format!(
            "{}/storage/v1/b/smoke/o/dir%2Fa%20b.txt?alt=media",
            gcs.endpoint
        ),
        &[],
        b"",
    );
    assert_eq!(status, 200);
    assert_eq!(body, b"hello gcs");
    assert_eq!(
        gcs.get_object("smoke", "dir/a b.txt").as_deref(),
        Some(&b"hello gcs"[..])
    );
    assert_eq!(gcs.get_object("smoke", "missing"), None);
    // Listing through the JSON API (chunked or not, the helper decodes it).
    let (status, body) = http_request(
        "GET",
        &format!("{}/storage/v1/b/smoke/o", gcs.endpoint),
        &[],
        b"",
    );
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("\"name\":\"dir/a b.txt\""));
}

/// gcsemulator, the peer of the GCS compose tests: objects in and out through the JSON API,
/// and what it is there for: a compose onto an object whose generation is not the one named
/// (the destination's `ifGenerationMatch`, or a source's `objectPreconditions`) is refused
/// 412, while one naming the right generations lands with both sources' bytes.
#[test]
fn gcsemu_starts_and_refuses_a_compose_onto_a_changed_object() {
    let Some(emu) = GcsEmu::start() else {
        return;
    };
    emu.put("smoke", "dir/a", b"hello ");
    emu.put("smoke", "dir/b", b"gcs");
    assert_eq!(emu.get("smoke", "dir/a").as_deref(), Some(&b"hello "[..]));
    assert_eq!(emu.get("smoke", "missing"), None);
    let listed = emu.list("smoke", "dir/");
    assert_eq!(listed.len(), 2, "{listed:?}");
    let generation = |name: &str| {
        listed
            .iter()
            .find(|o| o.name == name)
            .map(|o| o.generation)
            .unwrap()
    };
    let (a, b) = (generation("dir/a"), generation("dir/b"));
    let compose = |dest_generation: u64, a_generation: u64| {
        let body = format!(
            r#"{{"sourceObjects":[{{"name":"dir/a","generation":"{a_generation}","objectPreconditions":{{"ifGenerationMatch":"{a_generation}"}}}},{{"name":"dir/b","generation":"{b}","objectPreconditions":{{"ifGenerationMatch":"{b}"}}}}],"destination":{{"contentType":"application/octet-stream"}}}}"#
        );
        http_request(
            "POST",
            &format!(
                "{}/storage/v1/b/smoke/o/dir%2Fa/compose?ifGenerationMatch={dest_generation}",
                emu.endpoint
            ),
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
        .0
    };
    assert_eq!(compose(a + 1, a), 412, "a wrong destination generation");
    assert_eq!(compose(a, a + 1), 412, "a wrong source generation");
    assert_eq!(emu.get("smoke", "dir/a").as_deref(), Some(&b"hello "[..]));
    assert_eq!(compose(a, a), 200);
    assert_eq!(
        emu.get("smoke", "dir/a").as_deref(),
        Some(&b"hello gcs"[..])
    );
}

// ------------------------------------------------------------------ object_store

/// Result of one object_store operation: Ok(detail) or Err(error text).
type Outcome = Result<String, String>;

/// Runs the standard operation set against `store` (whose bucket/container
/// exists), printing a report. Returns (operation, outcome) pairs.
async fn exercise(name: &str, store: Arc<dyn ObjectStore>) -> Vec<(&'static str, Outcome)> {
    let mut results: Vec<(&'static str, Outcome)> = Vec::new();
    let small = Path::from("smoke/small.txt");
    let body = b"hello object_store".to_vec();

    let r = store
        .put(&small, PutPayload::from(body.clone()))
        .await
        .map(|r| format!("e_tag={:?} version={:?}", r.e_tag, r.version))
        .map_err(|e| e.to_string());
    results.push(("put", r));

    let r = match store.get(&small).await {
        Ok(g) => match g.bytes().await {
            Ok(b) if b.as_ref() == body.as_slice() => Ok(format!("{} bytes", b.len())),
            Ok(b) => Err(format!("wrong content: {:?}", String::from_utf8_lossy(&b))),
            Err(e) => Err(e.to_string()),
        },
        Err(e) => Err(e.to_string()),
    };
    results.push(("get", r));

    let r = store
        .head(&small)
        .await
        .map(|m| format!("size={} e_tag={:?}", m.size, m.e_tag))
        .map_err(|e| e.to_string());
    results.push(("head", r));

    let prefix = Path::from("smoke");
    let r = store
        .list(Some(&prefix))
        .try_collect::<Vec<_>>()
        .await
        .map_err(|e| e.to_string())
        .and_then(|v| {
            let names: Vec<String> = v.iter().map(|m| m.location.to_string()).collect();
            if names.contains(&small.to_string()) {
                Ok(format!("{names:?}"))
            } else {
                Err(format!("{small} missing from {names:?}"))
            }
        });
    results.push(("list", r));

    let r = store
        .list_with_delimiter(None)
        .await
        .map(|l| {
            format!(
                "prefixes={:?} objects={}",
                l.common_prefixes,
                l.objects.len()
            )
        })
        .map_err(|e| e.to_string());
    results.push(("list_with_delimiter", r));

    // Create-only put: first succeeds, second must fail with AlreadyExists.
    let once = Path::from("smoke/create-once.txt");
    let r = match store
        .put_opts(&once, PutPayload::from_static(b"1"), PutMode::Create.into())
        .await
    {
        Err(e) => Err(format!("first create failed: {e}")),
        Ok(_) => match store
            .put_opts(&once, PutPayload::from_static(b"2"), PutMode::Create.into())
            .await
        {
            Err(object_store::Error::AlreadyExists { .. }) => Ok("second is AlreadyExists".into()),
            Err(e) => Err(format!("second create: unexpected error {e}")),
            Ok(_) => Err("second create succeeded (overwrote)".into()),
        },
    };
    results.push(("put_opts(Create)", r));

    // Multipart: 5 MiB + 1 KiB parts (S3's minimum part size is 5 MiB).
    let big = Path::from("smoke/multipart.bin");
    let part1 = vec![b'a'; 5 * 1024 * 1024];
    let part2 = vec![b'b'; 1024];
    let r = async {
        let mut up = store.put_multipart(&big).await.map_err(|e| e.to_string())?;
        up.put_part(PutPayload::from(part1.clone()))
            .await
            .map_err(|e| format!("part 1: {e}"))?;
        up.put_part(PutPayload::from(part2.clone()))
            .await
            .map_err(|e| format!("part 2: {e}"))?;
        up.complete().await.map_err(|e| format!("complete: {e}"))?;
        let got = store
            .get(&big)
            .await
            .map_err(|e| format!("get: {e}"))?
            .bytes()
            .await
            .map_err(|e| format!("get body: {e}"))?;
        if got.len() == part1.len() + part2.len() && got[..part1.len()] == part1[..] {
            Ok(format!("{} bytes", got.len()))
        } else {
            Err(format!("read back {} bytes", got.len()))
        }
    }
    .await;
    results.push(("put_multipart", r));

    let r = async {
        store.delete(&small).await.map_err(|e| e.to_string())?;
        match store.get(&small).await {
            Err(object_store::Error::NotFound { .. }) => Ok("then get is NotFound".to_string()),
            Err(e) => Err(format!("get after delete: {e}")),
            Ok(_) => Err("object still there after delete".to_string()),
        }
    }
    .await;
    results.push(("delete", r));

    eprintln!("object_store against {name}:");
    for (op, r) in &results {
        match r {
            Ok(d) => eprintln!("  {op:<20} OK    {d}"),
            Err(e) => eprintln!("  {op:<20} FAIL  {e}"),
        }
    }
    results
}

fn assert_ok(results: &[(&str, Outcome)], ops: &[&str]) {
    for op in ops {
        let (_, r) = results
            .iter()
            .find(|(o, _)| o == op)
            .unwrap_or_else(|| panic!("no result for {op}"));
        assert!(r.is_ok(), "{op} failed: {}", r.as_ref().unwrap_err());
    }
}

#[test]
fn object_store_s3_against_moto() {
    let Some(s3) = MotoS3::start() else {
        return;
    };
    s3.create_bucket("os-bucket");
    let store = AmazonS3Builder::new()
        .with_endpoint(&s3.endpoint)
        .with_bucket_name("os-bucket")
        .with_allow_http(true)
        .with_region(MotoS3::REGION)
        .with_access_key_id(MotoS3::ACCESS_KEY_ID)
        .with_secret_access_key(MotoS3::SECRET_ACCESS_KEY)
        .with_retry(retry())
        .with_client_options(client_options())
        .build()
        .expect("build S3 store");
    let results = runtime().block_on(exercise("moto (S3)", Arc::new(store)));
    assert_ok(
        &results,
        &[
            "put",
            "get",
            "head",
            "list",
            "list_with_delimiter",
            "put_opts(Create)",
            "put_multipart",
            "delete",
        ],
    );
}

#[test]
fn object_store_azure_against_azurite() {
    let Some(az) = Azurite::start() else {
        return;
    };
    az.create_container("os-container");
    // Not `with_use_emulator(true)`: that reads the URL from AZURITE_BLOB_STORAGE_URL
    // (default http://127.0.0.1:10000), a process-wide variable. An explicit
    // endpoint that already holds the account segment works instead.
    let store = MicrosoftAzureBuilder::new()
        .with_endpoint(az.blob_endpoint.clone())
        .with_account(az.account)
        .with_access_key(az.key)
        .with_container_name("os-container")
        .with_allow_http(true)
        .with_retry(retry())
        .with_client_options(client_options())
        .build()
        .expect("build Azure store");
    let results = runtime().block_on(exercise("Azurite (Azure Blob)", Arc::new(store)));
    assert_ok(
        &results,
        &[
            "put",
            "get",
            "head",
            "list",
            "list_with_delimiter",
            "put_opts(Create)",
            "put_multipart",
            "delete",
        ],
    );
}

/// object_store's GCS client for `bucket` at `base_url`, without OAuth.
fn gcs_store(base_url: &str, bucket: &str) -> Arc<dyn ObjectStore> {
    // disable_oauth: no token requests (empty bearer); gcs_base_url: where
    // requests go. private_key/private_key_id/client_email must be present
    // but are not used.
    let key = format!(
        r#"{{"private_key":"unused","private_key_id":"unused","client_email":"unused@example.invalid","disable_oauth":true,"gcs_base_url":"{base_url}"}}"#
    );
    Arc::new(
        GoogleCloudStorageBuilder::new()
            .with_service_account_key(key)
            .with_bucket_name(bucket)
            .with_retry(retry())
            .with_client_options(client_options())
            .build()
            .expect("build GCS store"),
    )
}

/// Only the read side: fake-gcs-server 1.54 has no XML upload API, which is
/// what object_store's GCS `put` uses, so objects are made with
/// [`FakeGcs::put_object`] (its JSON upload API) and read, listed and deleted
/// through object_store. `put` must fail; if a newer server accepts it, the
/// GCS upload path becomes testable here.
#[test]
fn object_store_gcs_against_fake_gcs() {
    let Some(gcs) = FakeGcs::start() else {
        return;
    };
    gcs.create_bucket("os-bucket");
    gcs.put_object("os-bucket", "pre/one.txt", b"one");
    gcs.put_object("os-bucket", "pre/sub/two.txt", b"two");
    gcs.put_object("os-bucket", "pre/sub/gone soon.txt", b"bye");
    let store = gcs_store(&gcs.endpoint, "os-bucket");
    runtime().block_on(async {
        let got = store
            .get(&Path::from("pre/one.txt"))
            .await
            .expect("get an object made by the JSON API")
            .bytes()
            .await
            .unwrap();
        assert_eq!(got.as_ref(), b"one");

        let mut names: Vec<String> = store
            .list(Some(&Path::from("pre")))
            .try_collect::<Vec<_>>()
            .await
            .expect("list")
            .into_iter()
            .map(|m| m.location.to_string())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["pre/one.txt", "pre/sub/gone soon.txt", "pre/sub/two.txt"]
        );

        let l = store
            .list_with_delimiter(Some(&Path::from("pre")))
            .await
            .expect("list_with_delimiter");
        assert_eq!(l.objects.len(), 1, "{l:?}");
        assert_eq!(l.objects[0].location, Path::from("pre/one.txt"), "{l:?}");
        assert_eq!(l.common_prefixes, [Path::from("pre/sub")], "{l:?}");

        let meta = store
            .head(&Path::from("pre/sub/two.txt"))
            .await
            .expect("head");
        assert_eq!(meta.size, 3);

        match store.get(&Path::from("pre/missing")).await {
            Err(object_store::Error::NotFound { .. }) => {}
            other => panic!("get of a missing object: {other:?}"),
        }

        let doomed = Path::from("pre/sub/gone soon.txt");
        store.delete(&doomed).await.expect("delete");
        match store.get(&doomed).await {
            Err(object_store::Error::NotFound { .. }) => {}
            other => panic!("get after delete: {other:?}"),
        }

        // The server has no XML upload: object_store's put fails with 400.
        match store
            .put(&Path::from("pre/new"), PutPayload::from_static(b"x"))
            .await
        {
            Err(e) => assert!(e.to_string().contains("invalid uploadType"), "{e}"),
            Ok(_) => panic!(
                "fake-gcs-server now accepts object_store's XML PUT: the GCS upload \
                 path can be tested against it (tests/gcs_config.rs, docs/storage.md)"
            ),
        }
    });
    assert_eq!(gcs.get_object("os-bucket", "pre/sub/gone soon.txt"), None);
    assert_eq!(gcs.get_object("os-bucket", "pre/new"), None);
    assert_eq!(
        gcs.get_object("os-bucket", "pre/sub/two.txt").as_deref(),
        Some(&b"two"[..])
    );
}

#[test]
fn fake_gcs_restart_recreates_buckets() {
    let Some(mut gcs) = FakeGcs::start() else {
        return;
    };
    gcs.create_bucket("outage");
    gcs.put_object("outage", "a", b"a");
    let port = gcs.port;
    gcs.stop();
    assert!(!gcs.is_running());
    assert!(
        try_http_request("GET", &format!("{}/storage/v1/b", gcs.endpoint), &[], b"").is_err(),
        "fake-gcs-server still answers after stop()"
    );
    gcs.restart();
    assert!(gcs.is_running());
    assert_eq!(gcs.port, port);
    assert_eq!(gcs.endpoint, format!("http://127.0.0.1:{port}"));
    assert_eq!(
        gcs.get_object("outage", "a"),
        None,
        "state is in memory only"
    );
    gcs.put_object("outage", "b", b"b");
    assert_eq!(gcs.get_object("outage", "b").as_deref(), Some(&b"b"[..]));
}
