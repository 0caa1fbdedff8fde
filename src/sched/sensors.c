/*
 * sensors.c -- the device readings the governor plans from (see sensors.h).
 * Each file is small and read whole with one read(2); anything missing or
 * malformed leaves that sensor unknown.
 */
#include "sensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

struct sp_sensors {
    char *root, *thermal_file, *battery_file;
    double min_interval_s;
    bool have;                    /* a reading is cached */
    struct sp_sensor_reading last;
    bool have_stat;               /* the previous /proc/stat sample */
    uint64_t stat_busy;
    double stat_t, stat_self;
    uint64_t n_reads;
};

double sp_mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double self_cpu_s(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *sp_battery_status_name(enum sp_battery_status s) {
    switch (s) {
    case SP_BAT_CHARGING: return "Charging";
    case SP_BAT_DISCHARGING: return "Discharging";
    case SP_BAT_FULL: return "Full";
    case SP_BAT_NOT_CHARGING: return "Not charging";
    default: return "Unknown";
    }
}

static char *dup_or_null(const char *s) {
    return s && *s ? sp_strdup(s) : NULL;
}

sp_status sp_sensors_init(const struct sp_sensor_cfg *cfg, struct sp_sensors **out) {
    *out = NULL;
    struct sp_sensors *s = sp_calloc(1, sizeof *s);
    if (!s) return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    const struct sp_sensor_cfg c = cfg ? *cfg : (struct sp_sensor_cfg){0};
    s->root = sp_strdup(c.root && *c.root ? c.root : "");
    s->thermal_file = dup_or_null(c.thermal_file);
    s->battery_file = dup_or_null(c.battery_file);
    s->min_interval_s = c.min_interval_s > 0 ? c.min_interval_s : 0.25;
    if (!s->root || (c.thermal_file && *c.thermal_file && !s->thermal_file) ||
        (c.battery_file && *c.battery_file && !s->battery_file)) {
        sp_sensors_free(s);
        return sp_err(SP_E_NOMEM, "%s: out of memory", __func__);
    }
    *out = s;
    return SP_OK;
}

void sp_sensors_free(struct sp_sensors *s) {
    if (!s) return;
    sp_free(s->root);
    sp_free(s->thermal_file);
    sp_free(s->battery_file);
    sp_free(s);
}

uint64_t sp_sensors_n_reads(const struct sp_sensors *s) {
    return s->n_reads;
}

/* The text of a small file (at most cap-1 bytes, NUL-terminated); false when
 * it cannot be read. */
static bool read_small(const char *path, char *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0) return false;
    buf[n] = '\0';
    return true;
}

static void path_join(char *out, size_t cap, const char *root, const char *rel) {
    snprintf(out, cap, "%s/%s", root, rel);
}

/* A number at the start of text (after blanks); false if none. */
static bool leading_num(const char *text, double *v) {
    char *end;
    double x = strtod(text, &end);
    if (end == text) return false;
    while (*end == ' ' || *end == '\t') end++;
    if (*end != '\0' && *end != '\n' && *end != '\r') return false;
    *v = x;
    return true;
}

/* A millidegree reading in a plausible range. */
static bool temp_of(const char *path, double *c) {
    char buf[64];
    double v;
    if (!read_small(path, buf, sizeof buf) || !leading_num(buf, &v)) return false;
    v /= 1000.0;
    if (!(v > -60.0 && v < 250.0)) return false;
    *c = v;
    return true;
}

static void read_thermal(struct sp_sensors *s, struct sp_sensor_reading *r) {
    if (s->thermal_file) {
        r->has_temp = temp_of(s->thermal_file, &r->temp_c);
        return;
    }
    char dir[4096], p[4096 + 300];
    path_join(dir, sizeof dir, s->root, "sys/class/thermal");
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "thermal_zone", 12) != 0) continue;
        snprintf(p, sizeof p, "%s/%s/temp", dir, e->d_name);
        double c;
        if (temp_of(p, &c) && (!r->has_temp || c > r->temp_c)) {
            r->temp_c = c;
            r->has_temp = true;
        }
    }
    closedir(d);
}

static enum sp_battery_status status_of(const char *t, size_t n) {
    while (n && (t[n - 1] == '\n' || t[n - 1] == '\r' || t[n - 1] == ' ')) n--;
    while (n && (*t == ' ' || *t == '\t')) t++, n--;
    static const struct {
        const char *name;
        enum sp_battery_status st;
    } names[] = {{"Charging", SP_BAT_CHARGING},
                 {"Discharging", SP_BAT_DISCHARGING},
                 {"Full", SP_BAT_FULL},
                 {"Not charging", SP_BAT_NOT_CHARGING}};
    for (size_t i = 0; i < SP_ARRAY_LEN(names); i++)
        if (strlen(names[i].name) == n && strncasecmp(names[i].name, t, n) == 0) return names[i].st;
    return SP_BAT_UNKNOWN;
}

bool sp_sensors_parse_battery(const char *text, double *pct, enum sp_battery_status *st) {
    const char *nl = strchr(text, '\n');
    char line[64];
    size_t n = nl ? (size_t)(nl - text) : strlen(text);
    if (n >= sizeof line) return false;
    memcpy(line, text, n);
    line[n] = '\0';
    double v;
    if (!leading_num(line, &v) || !(v >= 0 && v <= 100)) return false;
    *pct = v;
    *st = SP_BAT_DISCHARGING; /* no status line: discharging */
    if (nl && nl[1]) {
        const char *l2 = nl + 1;
        const char *e2 = strchr(l2, '\n');
        size_t n2 = e2 ? (size_t)(e2 - l2) : strlen(l2);
        const enum sp_battery_status b = status_of(l2, n2);
        bool blank = true;
        for (size_t i = 0; i < n2; i++) blank &= l2[i] == ' ' || l2[i] == '\r' || l2[i] == '\t';
        if (!blank) *st = b;
    }
    return true;
}

static void read_battery(struct sp_sensors *s, struct sp_sensor_reading *r) {
    char buf[256];
    if (s->battery_file) {
        if (read_small(s->battery_file, buf, sizeof buf))
            r->has_battery = sp_sensors_parse_battery(buf, &r->battery_pct, &r->battery_status);
        return;
    }
    char dir[4096], p[4096 + 300];
    path_join(dir, sizeof dir, s->root, "sys/class/power_supply");
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) && !r->has_battery) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s/type", dir, e->d_name);
        if (read_small(p, buf, sizeof buf) && strncasecmp(buf, "Battery", 7) != 0) continue;
        snprintf(p, sizeof p, "%s/%s/capacity", dir, e->d_name);
        double v;
        if (!read_small(p, buf, sizeof buf) || !leading_num(buf, &v) || !(v >= 0 && v <= 100)) continue;
        r->has_battery = true;
        r->battery_pct = v;
        r->battery_status = SP_BAT_UNKNOWN;
        snprintf(p, sizeof p, "%s/%s/status", dir, e->d_name);
        if (read_small(p, buf, sizeof buf)) r->battery_status = status_of(buf, strlen(buf));
    }
    closedir(d);
}

bool sp_sensors_parse_psi(const char *text, double *some10, double *full10) {
    bool got_some = false;
    *full10 = 0;
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const bool some = strncmp(l, "some ", 5) == 0, full = strncmp(l, "full ", 5) == 0;
        if (!some && !full) continue;
        const char *a = strstr(l, "avg10=");
        const char *nl = strchr(l, '\n');
        if (!a || (nl && a > nl)) continue;
        char *end;
        const double v = strtod(a + 6, &end);
        if (end == a + 6) continue;
        if (some) {
            *some10 = v;
            got_some = true;
        } else {
            *full10 = v;
        }
    }
    return got_some;
}

bool sp_sensors_parse_stat(const char *text, uint64_t *busy, uint64_t *total) {
    if (strncmp(text, "cpu ", 4) != 0) return false;
    uint64_t v[10] = {0};
    const char *p = text + 4;
    int n = 0;
    for (; n < 10; n++) {
        char *end;
        while (*p == ' ') p++;
        if (*p < '0' || *p > '9') break;
        v[n] = strtoull(p, &end, 10);
        p = end;
    }
    if (n < 4) return false;
    /* user nice system idle iowait irq softirq steal (guest time is in user) */
    *busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    *total = *busy + v[3] + v[4];
    return true;
}

static void read_load(struct sp_sensors *s, struct sp_sensor_reading *r) {
    char buf[1024], p[4096];
    path_join(p, sizeof p, s->root, "proc/stat");
    uint64_t busy, total;
    const double self = r->cpu_self_s;
    if (!read_small(p, buf, sizeof buf) || !sp_sensors_parse_stat(buf, &busy, &total)) return;
    const double hz = (double)sysconf(_SC_CLK_TCK);
    if (s->have_stat && r->t_s - s->stat_t > 0.02 && hz > 0) {
        const double dt = r->t_s - s->stat_t;
        const double all = (double)(busy - s->stat_busy) / hz / dt;
        r->load_self = SP_MAX(0.0, (self - s->stat_self) / dt);
        r->load_other = SP_MAX(0.0, all - r->load_self);
        r->has_load = true;
    } else if (s->have && s->last.has_load) {
        r->has_load = true; /* too soon for a new difference: keep the last */
        r->load_other = s->last.load_other;
        r->load_self = s->last.load_self;
        return;
    }
    s->have_stat = true;
    s->stat_busy = busy;
    s->stat_t = r->t_s;
    s->stat_self = self;
}

void sp_sensors_read(struct sp_sensors *s, bool force, struct sp_sensor_reading *out) {
    const double now = sp_mono_s();
    if (s->have && !force && now - s->last.t_s < s->min_interval_s) {
        *out = s->last;
        return;
    }
    struct sp_sensor_reading r = {.t_s = now, .battery_status = SP_BAT_UNKNOWN};
    r.cpu_self_s = self_cpu_s();
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    r.n_cpus = nc > 0 ? (int)nc : 1;
    read_thermal(s, &r);
    read_battery(s, &r);
    char buf[512], p[4096];
    path_join(p, sizeof p, s->root, "proc/pressure/memory");
    if (read_small(p, buf, sizeof buf)) r.has_psi = sp_sensors_parse_psi(buf, &r.psi_some_avg10, &r.psi_full_avg10);
    read_load(s, &r);
    s->n_reads++;
    s->last = r;
    s->have = true;
    *out = r;
}
