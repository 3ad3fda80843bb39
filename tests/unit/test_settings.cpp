#include <catch2/catch.hpp>

#include "test_support.hpp"
#include "tierflow/error.hpp"
#include "tierflow/settings.hpp"

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
