// The transfer engine: every route bit-exact, link accounting, failures.

#include <cstring>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test_support.hpp"
#include "tierflow/emulated_device.hpp"
#include "tierflow/error.hpp"
#include "tierflow/transfer_engine.hpp"

using namespace tierflow;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

std::unique_ptr<emulated_device> make_device(double gbps) {
  emulated_device_options o;
  o.link.h2d_gbps = gbps;
  o.link.d2h_gbps = gbps;
  o.link.latency = std::chrono::microseconds(5);
  o.hbm_bytes = std::uint64_t{512} << 20;
  return emulated_device::create(o);
}

}  // namespace

TEST_CASE("every route moves the bytes exactly", "[transfer]") {
  auto dev = make_device(20.0);
  transfer_engine engine(*dev, transfer_options{mib, 2});
  auto gen = test::rng(500);
  using ms = memory_space;
  for (int round = 0; round < 6; ++round) {
    const auto bytes = std::uniform_int_distribution<std::size_t>(1, 7 * mib + 4321)(gen);
    INFO("round " << round << " bytes " << bytes);
    const auto source = test::random_bytes(bytes, gen);
    void* d1 = dev->memory().allocate(bytes);
    void* d2 = dev->memory().allocate(bytes);
    std::vector<unsigned char> pinned(bytes), back(bytes, 0), host_copy(bytes, 0);
    dev->host_registration().lock(pinned.data(), bytes);

    engine.copy(d1, ms::device, source.data(), ms::host, bytes)->synchronize();         // staged
    engine.copy(d2, ms::device, d1, ms::device, bytes)->synchronize();                  // d2d
    engine.copy(pinned.data(), ms::host_pinned, d2, ms::device, bytes)->synchronize();  // DMA
    CHECK(std::memcmp(pinned.data(), source.data(), bytes) == 0);
    std::memset(d1, 0, bytes);
    engine.copy(d1, ms::device, pinned.data(), ms::host_pinned, bytes)->synchronize();  // DMA
    engine.copy(back.data(), ms::host, d1, ms::device, bytes)->synchronize();           // staged
    CHECK(std::memcmp(back.data(), source.data(), bytes) == 0);
    engine.copy(host_copy.data(), ms::host, back.data(), ms::host, bytes)->synchronize();
    CHECK(host_copy == source);

    dev->host_registration().unlock(pinned.data(), bytes);
    dev->memory().deallocate(d1, bytes);
    dev->memory().deallocate(d2, bytes);
  }
}

TEST_CASE("links are accounted: bytes, transfers, achieved bandwidth", "[timing][transfer]") {
  auto dev = make_device(4.0);
  transfer_engine engine(*dev, transfer_options{2 * mib, 4});
  const std::size_t bytes = 48 * mib;
  std::vector<unsigned char> host(bytes, 5);
  void* d = dev->memory().allocate(bytes);
  std::memset(d, 0, bytes);
  for (int i = 0; i < 2; ++i) {
    engine.copy(d, memory_space::device, host.data(), memory_space::host_pinned, bytes)
        ->synchronize();
  }
  engine.copy(host.data(), memory_space::host_pinned, d, memory_space::device, bytes / 2)
      ->synchronize();
  dev->synchronize();
  const auto h2d = engine.link("h2d");
  CHECK(h2d.bytes == 2 * bytes);
  CHECK(h2d.transfers == 2);
  // Busy time is the link's: never shorter than bytes / cap (the cap's accuracy itself is the
  // device tests' business).
  CHECK(h2d.achieved_gbps() > 0.0);
  CHECK(h2d.achieved_gbps() <= 4.0 * 1.1);
  CHECK(h2d.busy_seconds >= 0.9 * static_cast<double>(2 * bytes) / 4e9);
  CHECK(engine.link("d2h").bytes == bytes / 2);
  CHECK(engine.link("nothing").bytes == 0);
  const auto doc = nlohmann::json::parse(engine.links_json());
  CHECK(doc.at("h2d").at("bytes") == 2 * bytes);
  CHECK(doc.at("d2h").at("transfers") == 1);
  CHECK(doc.at("h2d").at("achieved_gbps").get<double>() > 0.0);
  dev->memory().deallocate(d, bytes);
}

TEST_CASE("a failed chunk fails its transfer, which is not counted", "[transfer][faults]") {
  auto dev = make_device(20.0);
  transfer_engine engine(*dev, transfer_options{mib, 2});
  const std::size_t bytes = 6 * mib;
  std::vector<unsigned char> host(bytes, 3);
  void* d = dev->memory().allocate(bytes);
  SECTION("pinned path: the event reports it") {
    dev->fail_copy(dev->h2d_stream(), 3);
    auto done = engine.copy(d, memory_space::device, host.data(), memory_space::host_pinned, bytes);
    CHECK_THROWS_AS(done->synchronize(), device_error);
    CHECK_THROWS_AS(dev->h2d_stream().synchronize(), device_error);
  }
  SECTION("staged path: the call reports it") {
    dev->fail_copy(dev->h2d_stream(), 1);
    CHECK_THROWS_AS(engine.copy(d, memory_space::device, host.data(), memory_space::host, bytes),
                    device_error);
    CHECK_THROWS_AS(dev->h2d_stream().synchronize(), device_error);
  }
  CHECK(engine.link("h2d").bytes == 0);
  // Afterwards the same transfer goes through.
  engine.copy(d, memory_space::device, host.data(), memory_space::host, bytes)->synchronize();
  CHECK(static_cast<unsigned char*>(d)[bytes - 1] == 3);
  CHECK(engine.link("h2d").bytes == bytes);
  dev->memory().deallocate(d, bytes);
}

TEST_CASE("routes can be replaced, bad options are errors", "[transfer]") {
  auto dev = make_device(20.0);
  CHECK_THROWS_AS(transfer_engine(*dev, transfer_options{0, 1}), error);
  CHECK_THROWS_AS(transfer_engine(*dev, transfer_options{mib, 0}), error);
  transfer_engine engine(*dev);
  int calls = 0;
  engine.register_route(memory_space::host, memory_space::host,
                        [&](void* dst, const void* src, std::size_t n, event&) {
                          ++calls;
                          std::memcpy(dst, src, n);
                        });
  int a = 41, b = 0;
  engine.copy(&b, memory_space::host, &a, memory_space::host, sizeof a)->synchronize();
  CHECK(b == 41);
  CHECK(calls == 1);
  CHECK_THROWS_AS(engine.copy(nullptr, memory_space::host, &a, memory_space::host, 4), error);
}
