/* nm_mem_available, the load-time copies' budget: Linux's MemAvailable and
 * the limit of the process's memory cgroup (v1 and v2, ancestors too), read
 * here from trees of files made as Linux lays them out, each answer worked
 * out by hand; malformed files fall back to what the others say. On this
 * machine's own files it is checked against the test's own reading of
 * /proc/meminfo. */
#include "harness.h"

#include "base/base.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

/* Writes text to root + path, making the directories on the way. */
static void put(const char *path, const char *text) {
    char name[1024];
    snprintf(name, sizeof name, "%s%s", root, path);
    for (char *p = name + strlen(root) + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            if (mkdir(name, 0700) != 0 && errno != EEXIST) perror(name);
            *p = '/';
        }
    FILE *f = fopen(name, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void wipe(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/proc '%s'/sys", root, root);
    CHECK(system(cmd) == 0);
}

static uint64_t avail(void) { return nm_mem_available_under(root); }

#define MEMINFO_10G                                                                                \
    "MemTotal:       20000000 kB\nMemFree:          100 kB\nMemAvailable:   10485760 kB\n"
static const uint64_t ten_gib = 10ull << 30;

static void check_meminfo_only(void) {
    wipe();
    CHECK(avail() == UINT64_MAX); /* nothing says */
    put("/proc/meminfo", "MemTotal:       2000 kB\nMemAvailable:       1000 kB\nCached: 5 kB\n");
    CHECK_INT_EQ(avail(), 1000 * 1024);
    put("/proc/meminfo", "MemTotal: 2000 kB\nMemAvailable: lots kB\n");
    CHECK(avail() == UINT64_MAX); /* not a number: not believed */
    put("/proc/meminfo", "MemAvailable: 12x kB\n");
    CHECK(avail() == UINT64_MAX);
    put("/proc/meminfo", "MemAvailable: 99999999999999999999999 kB\n");
    CHECK(avail() == UINT64_MAX); /* past 64 bits */
}

static void check_v2(void) {
    wipe();
    put("/proc/meminfo", MEMINFO_10G);
    put("/proc/self/cgroup", "0::/a/b\n");
    /* no files for the cgroup: MemAvailable */
    CHECK_INT_EQ(avail(), ten_gib);
    /* limit 1000000, 600000 used of which 150000 file pages: 550000 */
    put("/sys/fs/cgroup/a/b/memory.max", "1000000\n");
    put("/sys/fs/cgroup/a/b/memory.current", "600000\n");
    put("/sys/fs/cgroup/a/b/memory.stat",
        "anon 400000\nfile 150000\nactive_file 100000\ninactive_file 50000\nslab 3\n");
    CHECK_INT_EQ(avail(), 550000);
    /* the parent's tighter limit: 700000 less 500000 held */
    put("/sys/fs/cgroup/a/memory.max", "700000\n");
    put("/sys/fs/cgroup/a/memory.current", "500000\n");
    CHECK_INT_EQ(avail(), 200000);
    /* the leaf without a limit: the parent's still holds */
    put("/sys/fs/cgroup/a/b/memory.max", "max\n");
    CHECK_INT_EQ(avail(), 200000);
    /* past its limit (file pages aside): nothing */
    put("/sys/fs/cgroup/a/memory.current", "900000\n");
    CHECK_INT_EQ(avail(), 0);
    /* a limit above MemAvailable: MemAvailable */
    put("/sys/fs/cgroup/a/memory.max", "99000000000000\n");
    CHECK_INT_EQ(avail(), ten_gib);
    /* the cgroup at the mount itself ("0::/", a container's view) */
    put("/proc/self/cgroup", "0::/"); /* the last line without its newline */
    put("/sys/fs/cgroup/memory.max", "3000000\n");
    put("/sys/fs/cgroup/memory.current", "1000000\n");
    CHECK_INT_EQ(avail(), 2000000);
    /* malformed limit and usage files: not believed */
    put("/sys/fs/cgroup/memory.max", "3000000 bytes\n");
    CHECK_INT_EQ(avail(), ten_gib);
    put("/sys/fs/cgroup/memory.max", "3000000\n");
    put("/sys/fs/cgroup/memory.current", "-5\n");
    CHECK_INT_EQ(avail(), ten_gib);
    put("/sys/fs/cgroup/memory.current", "");
    CHECK_INT_EQ(avail(), ten_gib);
    /* a path with doubled and trailing slashes walks up the same way, to
     * the mount's cgroup: 3000000 - 2500000 (a/b has no limit, a's is
     * far above) */
    put("/proc/self/cgroup", "0:://a//b/\n");
    put("/sys/fs/cgroup/memory.current", "2500000\n");
    CHECK_INT_EQ(avail(), 500000);
}

static void check_v1(void) {
    wipe();
    put("/proc/meminfo", MEMINFO_10G);
    /* a hybrid system: v1's memory controller wins over the "0::" line */
    put("/proc/self/cgroup", "9:name=systemd:/\n5:cpu,memory,pids:/x/y\n0::/\n");
    const char *stat_free = "cache 1\ntotal_active_file 300000\ntotal_inactive_file 200000\n"
                            "hierarchical_memory_limit 9223372036854771712\n";
    put("/sys/fs/cgroup/memory/x/y/memory.stat", stat_free);
    put("/sys/fs/cgroup/memory/x/y/memory.limit_in_bytes", "2000000\n");
    put("/sys/fs/cgroup/memory/x/y/memory.usage_in_bytes", "1500000\n");
    CHECK_INT_EQ(avail(), 1000000); /* 2000000 - (1500000 - 500000) */
    /* v1's "no limit" */
    put("/sys/fs/cgroup/memory/x/y/memory.limit_in_bytes", "9223372036854771712\n");
    CHECK_INT_EQ(avail(), ten_gib);
    /* an ancestor's limit, seen as hierarchical_memory_limit */
    put("/sys/fs/cgroup/memory/x/y/memory.stat",
        "total_active_file 300000\ntotal_inactive_file 200000\n"
        "hierarchical_memory_limit 1200000\n");
    CHECK_INT_EQ(avail(), 200000);
    /* a container that mounts its own cgroup at the top: the path is not
     * there, the files at the mount are the process's */
    wipe();
    put("/proc/meminfo", MEMINFO_10G);
    put("/proc/self/cgroup", "4:memory:/docker/abc\n");
    put("/sys/fs/cgroup/memory/memory.stat", stat_free);
    put("/sys/fs/cgroup/memory/memory.limit_in_bytes", "4000000\n");
    put("/sys/fs/cgroup/memory/memory.usage_in_bytes", "100000\n");
    CHECK_INT_EQ(avail(), 4000000); /* file pages above the usage: none held */
}

static void check_malformed_cgroup_list(void) {
    wipe();
    put("/proc/meminfo", MEMINFO_10G);
    put("/sys/fs/cgroup/memory.max", "1000\n");
    put("/sys/fs/cgroup/memory.current", "0\n");
    const char *bad[] = {"",           "garbage\n",     "0:\n",  "0::\n", "0::relative\n",
                         "1:memory\n", "1:memoryx:/\n", "::::\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        put("/proc/self/cgroup", bad[i]);
        CHECK_INT_EQ(avail(), ten_gib);
    }
    /* a line longer than any path: skipped, no crash */
    char *longline = malloc(10000);
    CHECK(longline != NULL);
    if (!longline) return;
    memcpy(longline, "0::/", 4);
    memset(longline + 4, 'a', 9994);
    memcpy(longline + 9998, "\n", 2);
    put("/proc/self/cgroup", longline);
    CHECK_INT_EQ(avail(), ten_gib);
    free(longline);
}

/* This machine: no more than its MemAvailable, read here independently. */
static void check_this_machine(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    fclose(f);
    const uint64_t got = nm_mem_available();
    CHECK(got > 0);
    /* MemAvailable moves between the two reads: within 64 MiB */
    CHECK(kib == 0 || got <= (uint64_t)kib * 1024 + (64ull << 20));
    printf("this machine: %llu MiB available to the process (MemAvailable %llu MiB)\n",
           (unsigned long long)(got >> 20), kib >> 10);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/nm_mem_available.XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    check_meminfo_only();
    check_v2();
    check_v1();
    check_malformed_cgroup_list();
    check_this_machine();
    wipe();
    rmdir(root);
    return nm_test_finish("test_mem_available");
}
