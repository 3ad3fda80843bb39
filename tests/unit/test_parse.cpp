#include <algorithm>
#include <set>

#include <catch2/catch.hpp>

#include "test_support.hpp"
#include "tierflow/detail/parse.hpp"

using namespace tierflow::detail;

TEST_CASE("id lists round-trip through format and parse", "[parse]") {
  auto gen = tierflow::test::rng(1);
  for (int round = 0; round < 200; ++round) {
    std::set<int> ids;
    const auto count = std::uniform_int_distribution<int>(1, 40)(gen);
    for (int i = 0; i < count; ++i) {
      ids.insert(std::uniform_int_distribution<int>(0, 300)(gen));
    }
    const std::vector<int> expected(ids.begin(), ids.end());
    const auto text = format_id_list(expected);
    INFO("list " << text);
    const auto parsed = parse_id_list(text + "\n");
    REQUIRE(parsed.has_value());
    CHECK(*parsed == expected);
  }
}

TEST_CASE("id lists in kernel format", "[parse]") {
  CHECK(parse_id_list("0-3,8,10-11\n") == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(parse_id_list("5") == std::vector<int>{5});
  CHECK(parse_id_list("\n") == std::vector<int>{});
  CHECK(parse_id_list("3,1,3") == std::vector<int>{1, 3});
  CHECK(format_id_list({7, 0, 1, 2, 5}) == "0-2,5,7");
}

TEST_CASE("malformed id lists are rejected", "[parse]") {
  for (const char* text : {"a", "1-", "-1", "3-1", "1,,2", "1 2", "0x1", "1-2-3", "99999999"}) {
    INFO("text '" << text << "'");
    CHECK_FALSE(parse_id_list(text).has_value());
  }
}

TEST_CASE("numbers parse whole or not at all", "[parse]") {
  auto gen = tierflow::test::rng(2);
  for (int i = 0; i < 100; ++i) {
    const auto value = gen();
    CHECK(parse_u64(" " + std::to_string(value) + "\n") == value);
    const auto signed_value = static_cast<std::int64_t>(gen());
    CHECK(parse_i64(std::to_string(signed_value)) == signed_value);
  }
  CHECK_FALSE(parse_u64("").has_value());
  CHECK_FALSE(parse_u64("12kB").has_value());
  CHECK_FALSE(parse_u64("-1").has_value());
  CHECK_FALSE(parse_u64("18446744073709551616").has_value());  // 2^64
  CHECK(parse_i64("-1") == -1);
}

TEST_CASE("trim and split", "[parse]") {
  CHECK(trim("  a b \n") == "a b");
  CHECK(trim(" \t\n").empty());
  CHECK(split("a;;b", ';') == std::vector<std::string_view>{"a", "", "b"});
}
