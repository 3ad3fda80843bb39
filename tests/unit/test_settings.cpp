#include <chrono>
#include <functional>
#include <string>

#include <catch2/catch.hpp>

#include "cli_runner.hpp"
#include "test_support.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/error.hpp"
#include "tierflow/placement_policy.hpp"
#include "tierflow/settings.hpp"
#include "tierflow/topology.hpp"
#include "topology/measured_cache.hpp"

using tierflow::input_error;
using tierflow::settings;

TEST_CASE("config file lines and comments", "[settings]") {
  tierflow::test::scoped_env env("TIERFLOW_TIERS", nullptr);
  const auto s =
      settings::from_text("# tiers of this box\n\n  tiers = cxl=2,3 ; dram=0  # x\n", "box.conf");
  const auto v = s.get("tiers");
  REQUIRE(v.has_value());
  CHECK(v->value == "cxl=2,3 ; dram=0");
  CHECK(v->origin == "box.conf:3");
}

TEST_CASE("the environment wins over the config file", "[settings]") {
  const auto s = settings::from_text("tiers = dram=0\n", "box.conf");
  tierflow::test::scoped_env env("TIERFLOW_TIERS", "cxl=1");
  const auto v = s.get("tiers");
  REQUIRE(v.has_value());
  CHECK(v->value == "cxl=1");
  CHECK(v->origin == "env TIERFLOW_TIERS");
}

TEST_CASE("no file and no environment means no value", "[settings]") {
  tierflow::test::scoped_env env("TIERFLOW_TIERS", nullptr);
  CHECK_FALSE(settings{}.get("tiers").has_value());
  CHECK_THROWS_AS(settings{}.get("no_such_key"), tierflow::error);
}

TEST_CASE("malformed config files name the line", "[settings]") {
  struct bad_case {
    const char* text;
    const char* origin;
    const char* problem;
  };
  for (const auto& c : {bad_case{"tiers\n", "f.conf:1", "expected 'key = value'"},
                        bad_case{"\ncolour = red\n", "f.conf:2", "unknown key"},
                        bad_case{"tiers =\n", "f.conf:1", "empty value"},
                        bad_case{"tiers = a=1\ntiers = b=2\n", "f.conf:2", "given twice"}}) {
    INFO("text: " << c.text);
    try {
      (void)settings::from_text(c.text, "f.conf");
      FAIL("no error");
    } catch (const input_error& e) {
      CHECK(e.source() == c.origin);
      CHECK_THAT(e.what(), Catch::Contains(c.problem));
    }
  }
}

TEST_CASE("errors stay one line whatever the input holds", "[settings]") {
  // Found by fuzz_specs: user text quoted in the problem carried its newline into the message.
  try {
    (void)settings::from_text("col\nour\x01 = 1\n", "f.conf");
    FAIL("no error");
  } catch (const input_error& e) {
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
  }
  const input_error e("src\nfile", "bad 'x\ny'", "a\nb");
  CHECK(std::string(e.what()) == "src\\nfile: bad 'x\\ny': 'a\\nb'");
}

TEST_CASE("config files are read from disk and TIERFLOW_CONFIG", "[settings]") {
  tierflow::test::scratch_dir dir;
  const auto path = dir.path() / "tierflow.conf";
  tierflow::test::write_file(path, "tiers = dram=0\n");
  tierflow::test::scoped_env no_tiers("TIERFLOW_TIERS", nullptr);
  CHECK(settings::from_file(path).get("tiers")->origin == path.string() + ":1");
  {
    tierflow::test::scoped_env config("TIERFLOW_CONFIG", path.c_str());
    CHECK(settings::from_environment().get("tiers")->value == "dram=0");
  }
  {
    const auto missing = (dir.path() / "missing.conf").string();
    tierflow::test::scoped_env config("TIERFLOW_CONFIG", missing.c_str());
    try {
      (void)settings::from_environment();
      FAIL("no error");
    } catch (const input_error& e) {
      CHECK(e.source() == missing);
      CHECK_THAT(e.what(), Catch::Contains("cannot read"));
    }
  }
}

TEST_CASE("every setting is read from the file TIERFLOW_CONFIG names, by the part that uses it",
          "[settings]") {
  namespace test = tierflow::test;
  test::scoped_env no_tiers("TIERFLOW_TIERS", nullptr);
  test::scoped_env no_placement("TIERFLOW_PLACEMENT", nullptr);
  test::scoped_env no_link("TIERFLOW_EMU_LINK", nullptr);
  test::scoped_env no_cache("TIERFLOW_CACHE_DIR", nullptr);
  auto gen = test::rng(0x5e77);
  const int h2d = std::uniform_int_distribution<int>(2, 90)(gen);
  const int latency_us = std::uniform_int_distribution<int>(1, 50)(gen);
  test::scratch_dir dir;
  const auto conf = dir.path() / "tierflow.conf";
  const auto cache = dir.path() / "cache";
  test::write_file(conf, "# a user's file\ntiers = cxl=0\nemu_link = h2d=" + std::to_string(h2d) +
                             "GB/s,latency=" + std::to_string(latency_us) +
                             "us\ncache_dir = " + cache.string() + "\n");
  test::scoped_env config("TIERFLOW_CONFIG", conf.c_str());
  INFO("h2d " << h2d << " GB/s, latency " << latency_us << " us");

  // Discovery without settings of its own classifies by the file's `tiers`.
  tierflow::discovery_options o;
  o.sysfs_root = test::sysfs_fixture("laptop");
  const auto topo = tierflow::topology::discover(o);
  REQUIRE(topo.find_node(tierflow::numa_node_id{0}) != nullptr);
  CHECK(topo.find_node(tierflow::numa_node_id{0})->kind == tierflow::tier_kind::cxl);
  CHECK_THAT(topo.find_node(tierflow::numa_node_id{0})->kind_reason,
             Catch::Contains(conf.string() + ":2"));
  // The emulated device's link, and the measured cache's folder.
  const auto link = tierflow::link_model::from_environment();
  CHECK(link.h2d_gbps == Approx(h2d));
  CHECK(link.latency == std::chrono::microseconds(latency_us));
  CHECK(tierflow::detail::default_measured_cache_dir() == cache / "");
  {  // the environment wins over the file
    test::scoped_env env_link("TIERFLOW_EMU_LINK", "h2d=3GB/s");
    CHECK(tierflow::link_model::from_environment().h2d_gbps == Approx(3));
  }

  // Bad content is an input error that names the file and line, wherever it is read.
  const auto refused = [&](const std::string& text, const std::function<void()>& use) {
    test::write_file(conf, "\n" + text + "\n");
    INFO(text);
    try {
      use();
      FAIL("accepted");
    } catch (const input_error& e) {
      CHECK(e.source() == conf.string() + ":2");
    }
  };
  refused("placement = optimizer_state=nosuch0", [&] { tierflow::placement_policy p(topo); });
  refused("emu_link = h2d=0GB/s", [] { (void)tierflow::link_model::from_environment(); });
  refused("cache_dir = relative/cache",
          [] { (void)tierflow::detail::default_measured_cache_dir(); });
  refused("tiers = cxl=9", [&] { (void)tierflow::topology::discover(o); });
}

TEST_CASE("cli: every command honours TIERFLOW_CONFIG, and a bad value in it is exit code 2",
          "[settings][cli]") {
  tierflow::test::scratch_dir dir;
  const auto conf = dir.path() / "tierflow.conf";
  tierflow::test::write_file(conf, "placement = optimizer_state=nosuch0\n");
  const auto r = tierflow::test::cli::run_cli(
      {"demo", "--steps", "2", "--layers", "2", "--width", "64", "--device", "emulated"},
      tierflow::test::cli::quote("TIERFLOW_CONFIG=" + conf.string()));
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains(conf.string() + ":1"));
  CHECK_THAT(r.err, Catch::Contains("nosuch0"));
}
