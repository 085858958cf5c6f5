// The data-parallel routing choice (server/dp_route.c) and the replicas' layout (replicas.c).
#include <string.h>

#include "server/dp_route.h"
#include "server/replicas.h"
#include "test.h"

typedef kaon_dp_replica_state st;

static void test_route(void) {
    // One replica: always it.
    st one[1] = {{0, 100, 0.9}};
    CHECK(kaon_dp_route(one, 1) == 0);
    // No hit anywhere: the least loaded, then the least KV in use, then the lowest index.
    st idle[3] = {{0, 2, 0.1}, {0, 1, 0.5}, {0, 1, 0.2}};
    CHECK(kaon_dp_route(idle, 3) == 2);
    st tie[3] = {{0, 1, 0.2}, {0, 1, 0.2}, {0, 1, 0.2}};
    CHECK(kaon_dp_route(tie, 3) == 0);
    // The longest cached prefix wins over a lighter load...
    st hit[3] = {{0, 0, 0}, {64, 3, 0.4}, {32, 0, 0}};
    CHECK(kaon_dp_route(hit, 3) == 1);
    // ... equal hits go by load.
    st hit2[2] = {{64, 3, 0}, {64, 2, 0.9}};
    CHECK(kaon_dp_route(hit2, 2) == 1);
    // ... but not to a replica far busier than the idlest (the balance slack).
    st busy[2] = {{0, 0, 0}, {512, KAON_DP_BALANCE_SLACK + 1, 0.5}};
    CHECK(kaon_dp_route(busy, 2) == 0);
    st edge[2] = {{0, 0, 0}, {512, KAON_DP_BALANCE_SLACK, 0.5}};
    CHECK(kaon_dp_route(edge, 2) == 1);
    // Under heavy load the slack grows with it (twice the idlest).
    st heavy[2] = {{0, 100, 0}, {512, 190, 0.5}};
    CHECK(kaon_dp_route(heavy, 2) == 1);
    st heavier[2] = {{0, 100, 0}, {512, 201, 0.5}};
    CHECK(kaon_dp_route(heavier, 2) == 0);
}

static void test_layout(void) {
    char d[32];
    CHECK(kaon_replica_device("cuda", 1, 1, 2, d, sizeof d) == 0 && !strcmp(d, "cuda:1"));
    CHECK(kaon_replica_device("cuda", 1, 0, 2, d, sizeof d) == 0 && !strcmp(d, "cuda:0"));
    CHECK(kaon_replica_device("cuda:2", 1, 1, 2, d, sizeof d) == 0 && !strcmp(d, "cuda:3"));
    CHECK(kaon_replica_device("cuda", 2, 1, 2, d, sizeof d) == 0 && !strcmp(d, "cuda:2"));
    CHECK(kaon_replica_device("cuda", 1, 0, 1, d, sizeof d) == 0 && !strcmp(d, "cuda"));
    CHECK(kaon_replica_device("cpu", 1, 1, 2, d, sizeof d) == 0 && !strcmp(d, "cpu"));
    CHECK(kaon_replica_device(NULL, 1, 1, 2, d, sizeof d) == 0 && !strcmp(d, "cpu"));
    CHECK(kaon_replica_device("cuda", 1, 1, 2, d, 4) == -1);
    CHECK(kaon_replica_threads(8, 2) == 4);
    CHECK(kaon_replica_threads(3, 2) == 1);
    CHECK(kaon_replica_threads(1, 4) == 1);
    CHECK(kaon_replica_threads(6, 1) == 6);
    CHECK(kaon_replica_threads(0, 1) >= 1);
}

int main(void) {
    test_route();
    test_layout();
    TEST_MAIN_END();
}
