#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

// catch_discover_tests splits test names at semicolons, and CTest then runs filters that match
// no test and pass without running anything: a name with one would be a test CI never runs.
TEST_CASE("every test name reaches CTest whole: no semicolon in any", "[meta]") {
  const auto& tests = Catch::getRegistryHub().getTestCaseRegistry().getAllTests();
  CHECK(tests.size() > 100);
  for (const auto& test : tests) {
    INFO(test.name);
    CHECK(test.name.find(';') == std::string::npos);
  }
}
