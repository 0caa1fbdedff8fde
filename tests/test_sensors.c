/*
 * test_sensors.c -- src/sched/sensors.c on files the test writes: the hottest
 * of several thermal zones (and bad zones ignored), --thermal-file, the
 * battery from a power-supply tree and from --battery-file (status line
 * optional, "Not charging"), memory pressure, /proc/stat parsing and the
 * competing-load difference, absent sensors unknown (never an error), and
 * the rate limit on reads.
 */
#include "sched/sensors.h"

#include "test_util.h"

#include <sys/stat.h>

static char root[4096];

static void put(const char *rel, const char *text) {
    char p[4600], d[4600];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    snprintf(d, sizeof d, "%s", p);
    for (char *s = d + strlen(root) + 1; (s = strchr(s, '/')); s++) {
        *s = '\0';
        mkdir(d, 0755);
        *s = '/';
    }
    FILE *f = fopen(p, "w");
    CHECKF(f != NULL, "cannot write %s", p);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void test_parsers(void) {
    double pct;
    enum sp_battery_status st;
    CHECK(sp_sensors_parse_battery("57\n", &pct, &st) && pct == 57 && st == SP_BAT_DISCHARGING);
    CHECK(sp_sensors_parse_battery("15", &pct, &st) && pct == 15 && st == SP_BAT_DISCHARGING);
    CHECK(sp_sensors_parse_battery("15\nCharging\n", &pct, &st) && st == SP_BAT_CHARGING);
    CHECK(sp_sensors_parse_battery("100\nFull", &pct, &st) && st == SP_BAT_FULL && sp_battery_on_power(st));
    CHECK(sp_sensors_parse_battery("19\nNot charging\n", &pct, &st) && st == SP_BAT_NOT_CHARGING &&
          !sp_battery_on_power(st));
    CHECK(sp_sensors_parse_battery("19\n\n", &pct, &st) && st == SP_BAT_DISCHARGING);
    CHECK(!sp_sensors_parse_battery("abc\n", &pct, &st));
    CHECK(!sp_sensors_parse_battery("150\n", &pct, &st));
    CHECK(!sp_sensors_parse_battery("", &pct, &st));

    uint64_t busy, total;
    CHECK(sp_sensors_parse_stat("cpu  100 5 50 1000 20 3 2 0 0 0\ncpu0 1 2 3 4\n", &busy, &total));
    CHECK(busy == 160 && total == 1180);
    CHECK(!sp_sensors_parse_stat("intr 1 2 3\n", &busy, &total));

    double s10, f10;
    CHECK(sp_sensors_parse_psi("some avg10=1.50 avg60=0.20 avg300=0.00 total=123\n"
                               "full avg10=0.75 avg60=0.10 avg300=0.00 total=45\n",
                               &s10, &f10));
    CHECK(s10 == 1.5 && f10 == 0.75);
    CHECK(!sp_sensors_parse_psi("nothing here\n", &s10, &f10));
}

static void test_tree(void) {
    snprintf(root, sizeof root, "%s/sp-sensors-%d", scratch_dir(), (int)getpid());
    mkdir(root, 0755);
    put("sys/class/thermal/thermal_zone0/temp", "41000\n");
    put("sys/class/thermal/thermal_zone1/temp", "58500\n");
    put("sys/class/thermal/thermal_zone2/temp", "garbage\n");
    put("sys/class/thermal/thermal_zone3/temp", "999999999\n"); /* implausible: ignored */
    put("sys/class/thermal/cooling_device0/cur_state", "1\n");
    put("sys/class/power_supply/AC/type", "Mains\n");
    put("sys/class/power_supply/AC/online", "1\n");
    put("sys/class/power_supply/BAT0/type", "Battery\n");
    put("sys/class/power_supply/BAT0/capacity", "18\n");
    put("sys/class/power_supply/BAT0/status", "Discharging\n");
    put("proc/pressure/memory", "some avg10=2.00 avg60=0.00 avg300=0.00 total=1\nfull avg10=0.50 avg60=0 avg300=0 total=1\n");
    put("proc/stat", "cpu  100 0 0 1000 0 0 0 0 0 0\n");

    struct sp_sensors *s;
    struct sp_sensor_cfg cfg = {.root = root, .min_interval_s = 0.05};
    CHECK(sp_sensors_init(&cfg, &s) == SP_OK);
    struct sp_sensor_reading r;
    sp_sensors_read(s, true, &r);
    CHECK(r.has_temp && fabs(r.temp_c - 58.5) < 1e-9);
    CHECK(r.has_battery && r.battery_pct == 18 && r.battery_status == SP_BAT_DISCHARGING);
    CHECK(r.has_psi && r.psi_some_avg10 == 2.0 && r.psi_full_avg10 == 0.5);
    CHECK(!r.has_load); /* one sample of /proc/stat: no difference yet */
    CHECK(r.n_cpus >= 1 && r.cpu_self_s > 0);

    /* cached within the interval */
    const uint64_t n0 = sp_sensors_n_reads(s);
    put("sys/class/thermal/thermal_zone1/temp", "30000\n");
    sp_sensors_read(s, false, &r);
    CHECK(sp_sensors_n_reads(s) == n0 && fabs(r.temp_c - 58.5) < 1e-9);
    usleep(120 * 1000);
    /* other work: 100 jiffies more than idle grew by, over ~0.12 s */
    put("proc/stat", "cpu  10100 0 0 1000 0 0 0 0 0 0\n");
    sp_sensors_read(s, false, &r);
    CHECK(sp_sensors_n_reads(s) == n0 + 1);
    CHECK(r.has_temp && fabs(r.temp_c - 41.0) < 1e-9);
    CHECK(r.has_load && r.load_other > 1.0);
    sp_sensors_free(s);

    /* files instead of the trees: the thermal file and a battery file */
    char tf[4600], bf[4600];
    snprintf(tf, sizeof tf, "%s/temp", root);
    snprintf(bf, sizeof bf, "%s/battery", root);
    put("temp", "60000\n");
    put("battery", "12\nCharging\n");
    cfg = (struct sp_sensor_cfg){.root = root, .thermal_file = tf, .battery_file = bf};
    CHECK(sp_sensors_init(&cfg, &s) == SP_OK);
    sp_sensors_read(s, true, &r);
    CHECK(r.has_temp && r.temp_c == 60.0);
    CHECK(r.has_battery && r.battery_pct == 12 && r.battery_status == SP_BAT_CHARGING);
    put("battery", "12\n");
    sp_sensors_read(s, true, &r);
    CHECK(r.has_battery && r.battery_status == SP_BAT_DISCHARGING);
    put("battery", "not a number\n");
    sp_sensors_read(s, true, &r);
    CHECK(!r.has_battery);
    sp_sensors_free(s);

    /* nothing there: everything unknown, nothing fails */
    char empty[4600];
    snprintf(empty, sizeof empty, "%s/empty-root", root);
    mkdir(empty, 0755);
    snprintf(tf, sizeof tf, "%s/no-such-file", root);
    cfg = (struct sp_sensor_cfg){.root = empty, .thermal_file = tf};
    CHECK(sp_sensors_init(&cfg, &s) == SP_OK);
    sp_sensors_read(s, true, &r);
    CHECK(!r.has_temp && !r.has_battery && !r.has_psi && !r.has_load);
    sp_sensors_free(s);

    /* the real machine: whatever it has, a reading never fails */
    CHECK(sp_sensors_init(NULL, &s) == SP_OK);
    sp_sensors_read(s, true, &r);
    CHECK(r.n_cpus >= 1);
    sp_sensors_free(s);

    char cmd[4700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
}

int main(void) {
    test_parsers();
    test_tree();
    return test_report("test_sensors");
}
