//! Each profile's conformance suite (`idemgate_tools::conformance`, one table of
//! cases per profile; docs/profiles.md) run against the real gateway with
//! a route of that profile in front of the real `idemgate mock-upstream`:
//! every case passes, and the mock commits exactly the writes each case
//! says. Against the mock alone, which honours no key, exactly the cases
//! that need an idempotency layer fail — so a case that cannot fail would
//! show here. And `idemgate conformance`, the binary, refuses to run
//! without `--writes`, says how many requests it will make, fails against
//! the mock naming why, and passes against the gateway.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use idemgate::profile::Profile;
use idemgate_tools::conformance::{Runner, cases};
use idemgate_tools::mock_upstream::MockUpstream;

/// A bound on one `idemgate conformance` run: its in-flight case waits
/// 1.5 s upstream, the rest are quick.
const CLI_RUN: Duration = Duration::from_secs(90);

async fn start_mock() -> MockUpstream {
    MockUpstream::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("the mock starts")
}

/// A gateway whose one route speaks `profile`, in front of `mock`.
async fn gateway(profile: Profile, mock: &MockUpstream) -> TestGateway {
    let setup = Setup::route(&format!("profile = \"{}\"", profile.name()))
        .upstream_url(format!("http://{}", mock.addr()));
    spawn_gateway_with(setup).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_profile_passes_its_own_suite_through_the_gateway() {
    for profile in Profile::HTTP {
        let mock = start_mock().await;
        let gw = gateway(profile, &mock).await;
        let runner = Runner::new(&format!("http://{}", gw.addr()), profile).unwrap();
        for (index, case) in cases(profile).iter().enumerate() {
            let before = mock.writes();
            let verdict = runner.run(index, case).await;
            assert!(
                verdict.passed(),
                "{}: {} failed: {:?}",
                profile.name(),
                case.name,
                verdict.failures
            );
            assert_eq!(
                mock.writes() - before,
                case.writes,
                "{}: {}: writes the mock committed",
                profile.name(),
                case.name
            );
        }
        mock.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_a_plain_api_exactly_the_cases_that_need_a_layer_fail() {
    let mock = start_mock().await;
    for profile in Profile::HTTP {
        let runner = Runner::new(&format!("http://{}", mock.addr()), profile).unwrap();
        let table = cases(profile);
        assert!(table.iter().any(|c| c.needs_layer), "{}", profile.name());
        for (index, case) in table.iter().enumerate() {
            let verdict = runner.run(index, case).await;
            assert_eq!(
                verdict.passed(),
                !case.needs_layer,
                "{}: {}: {:?}",
                profile.name(),
                case.name,
                verdict.failures
            );
        }
    }
    mock.stop().await;
}

/// A profile's suite under another profile's route fails somewhere: the
/// tables tell the conventions apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_of_another_profile_fails_the_suite() {
    let mock = start_mock().await;
    let gw = gateway(Profile::Idemgate, &mock).await;
    for profile in [
        Profile::Ietf,
        Profile::Stripe,
        Profile::Acp,
        Profile::Oasis,
        Profile::Ucp,
    ] {
        let runner = Runner::new(&format!("http://{}", gw.addr()), profile).unwrap();
        let mut failed = 0;
        for (index, case) in cases(profile).iter().enumerate() {
            failed += usize::from(!runner.run(index, case).await.passed());
        }
        assert!(failed > 0, "{} passes on an idemgate route", profile.name());
    }
    mock.stop().await;
}

fn conformance(target: &str, writes: bool) -> Command {
    let mut cmd = binary();
    cmd.args(["conformance", "--target", target, "--profile", "acp"]);
    if writes {
        cmd.arg("--writes");
    }
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_needs_writes_and_tells_a_plain_api_from_the_gateway() {
    let mock = start_mock().await;
    let requests: usize = cases(Profile::Acp).iter().map(|c| c.requests()).sum();
    let plain = format!("http://{}", mock.addr());

    let before = mock.writes();
    let (status, stdout, stderr) = run_to_exit_within(conformance(&plain, false), CLI_RUN).await;
    assert!(!status.success(), "ran without --writes: {stdout}");
    assert!(
        stderr.contains("--writes") && stderr.contains(&format!("{requests} writes")),
        "{stderr}"
    );
    assert_eq!(mock.writes(), before, "nothing sent without --writes");

    let (status, stdout, stderr) = run_to_exit_within(conformance(&plain, true), CLI_RUN).await;
    assert!(!status.success(), "a plain API passed: {stdout}");
    assert!(
        stdout.contains(&format!("{requests} requests")),
        "says how many first: {stdout}"
    );
    assert!(
        stdout.contains("FAIL  replay") && stdout.contains("needs an idempotency layer"),
        "{stdout}\n{stderr}"
    );
    assert!(stdout.contains("pass  key-scoped-by-path"), "{stdout}");

    let gw = gateway(Profile::Acp, &mock).await;
    let through = format!("http://{}", gw.addr());
    let (status, stdout, stderr) = run_to_exit_within(conformance(&through, true), CLI_RUN).await;
    let total = cases(Profile::Acp).len();
    assert!(status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("{total}/{total} cases passed")),
        "{stdout}"
    );
    mock.stop().await;
}

/// A target nobody answers at failed every case "needs an idempotency
/// layer that honours the key; the target does not", a verdict about a
/// target never heard: a case with an unanswered request says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_target_is_said_unanswered_not_judged() {
    let closed = format!("http://{}", closed_port().await);
    let (status, stdout, stderr) = run_to_exit_within(conformance(&closed, true), CLI_RUN).await;
    assert!(!status.success(), "{stdout}");
    assert!(
        stdout.contains("FAIL  replay") && stdout.contains("did not answer every request"),
        "{stdout}\n{stderr}"
    );
    assert!(!stdout.contains("honours the key"), "{stdout}");
}
