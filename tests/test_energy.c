/* The RAPL energy reader against made-up powercap trees in a temporary
 * folder: package zones summed, subzones and psys left out, a counter that
 * wrapped at max_energy_range_uj, and every way a reading is not
 * available (no folder, no package zone, an unreadable or malformed
 * counter), each with its reason; closed-form joules. */
#include "harness.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static void put(const char *zone, const char *file, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, zone);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/%s", root, zone, file);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void zone(const char *name, const char *kind, unsigned long long uj,
                 unsigned long long max_uj) {
    char v[32];
    put(name, "name", kind);
    snprintf(v, sizeof v, "%llu\n", uj);
    put(name, "energy_uj", v);
    snprintf(v, sizeof v, "%llu\n", max_uj);
    put(name, "max_energy_range_uj", v);
}

static void remove_tree(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
}

int main(void) {
    snprintf(root, sizeof root, "%s/test_energy_XXXXXX", NM_BUILD_DIR);
    CHECK(mkdtemp(root) != NULL);

    /* two packages, a core subzone, a dram subzone and a psys zone */
    zone("intel-rapl:0", "package-0\n", 1000, 2000);
    zone("intel-rapl:0:0", "core\n", 5, 1000);
    zone("intel-rapl:0:1", "dram\n", 7, 1000);
    zone("intel-rapl:1", "package-1\n", 10, 1000000);
    zone("intel-rapl:2", "psys\n", 500, 1000000);
    nm_energy_sample a, b;
    nm_energy_read(root, &a);
    CHECK(a.available);
    CHECK_INT_EQ(a.n_zones, 2);
    CHECK_INT_EQ(a.uj[0], 1000);
    CHECK_INT_EQ(a.max_uj[0], 2000);
    CHECK_INT_EQ(a.uj[1], 10);
    /* package 0 wrapped: 1000 to its max 2000, then 0 to 500; package 1
     * 10 to 30; the subzones and psys count nothing */
    zone("intel-rapl:0", "package-0\n", 500, 2000);
    zone("intel-rapl:1", "package-1\n", 30, 1000000);
    zone("intel-rapl:0:0", "core\n", 999, 1000);
    zone("intel-rapl:2", "psys\n", 900000, 1000000);
    nm_energy_read(root, &b);
    CHECK(b.available);
    CHECK_NEAR(nm_energy_joules(&a, &b), (1000 + 500 + 20) * 1e-6, 1e-15);
    CHECK_NEAR(nm_energy_joules(&a, &a), 0, 0);
    printf("two packages, one wrapped: %.9f J\n", nm_energy_joules(&a, &b));

    /* an unreadable counter (a folder where the file should be: unreadable
     * even by root) */
    char path[512];
    snprintf(path, sizeof path, "%s/intel-rapl:1/energy_uj", root);
    CHECK(unlink(path) == 0);
    CHECK(mkdir(path, 0755) == 0);
    nm_energy_read(root, &b);
    CHECK(!b.available && b.n_zones == 0);
    CHECK(strstr(b.why, "cannot read") && strstr(b.why, "intel-rapl:1/energy_uj"));
    printf("unreadable: %s\n", b.why);
    CHECK_NEAR(nm_energy_joules(&a, &b), -1, 0);
    CHECK(rmdir(path) == 0);

    /* a malformed counter, and one beyond its range */
    put("intel-rapl:1", "energy_uj", "12abc\n");
    nm_energy_read(root, &b);
    CHECK(!b.available && strstr(b.why, "is not a counter"));
    put("intel-rapl:1", "energy_uj", "2000000\n");
    nm_energy_read(root, &b);
    CHECK(!b.available && strstr(b.why, "beyond max_energy_range_uj"));
    put("intel-rapl:1", "energy_uj", "30\n");
    nm_energy_read(root, &b);
    CHECK(b.available);

    /* samples of other zones do not compare */
    zone("intel-rapl:3", "package-2\n", 1, 1000);
    nm_energy_read(root, &b);
    CHECK(b.available && b.n_zones == 3);
    CHECK_NEAR(nm_energy_joules(&a, &b), -1, 0);
    remove_tree();

    /* no package zone; no folder at all */
    CHECK(mkdir(root, 0755) == 0);
    zone("intel-rapl:0", "psys\n", 1, 1000);
    nm_energy_read(root, &b);
    CHECK(!b.available && strstr(b.why, "no RAPL package zone"));
    remove_tree();
    nm_energy_read(root, &b);
    CHECK(!b.available && strstr(b.why, "no RAPL energy counters"));
    printf("no folder: %s\n", b.why);
    /* this machine: a reading or a reason, never a guess */
    nm_energy_read(NULL, &b);
    printf("this machine: %s\n", b.available ? "RAPL package counters readable" : b.why);
    CHECK(b.available ? b.n_zones >= 1 : b.why[0] != '\0');
    return nm_test_finish("test_energy");
}
