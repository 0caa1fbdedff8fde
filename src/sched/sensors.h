/*
 * sensors.h -- what the governor (governor.h) reads about the device: the
 * hottest thermal zone, the battery, memory pressure, competing CPU load and
 * the process's own CPU time.  Every sensor is optional: one that is absent
 * or unreadable is reported unknown (its has_ flag false), never an error.
 * Readings are cached: sp_sensors_read goes to the files at most once per
 * min_interval_s unless forced.
 *
 * Sources (paths under root, "" = the real "/"):
 *   temperature  sys/class/thermal/thermal_zoneN/temp (millidegrees C, the
 *                hottest zone), or thermal_file: one such number
 *   battery      sys/class/power_supply/NAME/capacity and status (a supply whose
 *                type is Battery, or any with a capacity when there is no type),
 *                or battery_file: line 1 the capacity in percent, optional line
 *                2 the status as sysfs spells it ("Charging", "Discharging",
 *                "Full", "Not charging"); no status = discharging
 *   pressure     proc/pressure/memory ("some avg10=..", "full avg10=..")
 *   CPU load     proc/stat's cpu line (busy jiffies of the whole machine) less
 *                the process's own CPU time (CLOCK_PROCESS_CPUTIME_ID), over
 *                the wall time between two readings: other work, in cores
 */
#ifndef SP_SCHED_SENSORS_H
#define SP_SCHED_SENSORS_H

#include "core/core.h"

#include <stdbool.h>

enum sp_battery_status {
    SP_BAT_UNKNOWN = 0,
    SP_BAT_CHARGING,
    SP_BAT_DISCHARGING,
    SP_BAT_FULL,
    SP_BAT_NOT_CHARGING,
};
/* "Charging", "Discharging", "Full", "Not charging", "Unknown". */
const char *sp_battery_status_name(enum sp_battery_status s);
/* On external power (charging or full). */
static inline bool sp_battery_on_power(enum sp_battery_status s) {
    return s == SP_BAT_CHARGING || s == SP_BAT_FULL;
}

struct sp_sensor_cfg {
    const char *root;         /* prefix of the sysfs/procfs paths; NULL or "" = "/" (tests: a folder) */
    const char *thermal_file; /* instead of the thermal zones (NULL: the zones) */
    const char *battery_file; /* instead of the power supplies (NULL: the supplies) */
    double min_interval_s;    /* <= 0: 0.25 */
};

struct sp_sensor_reading {
    double t_s;               /* CLOCK_MONOTONIC seconds of the reading */
    bool has_temp;
    double temp_c;            /* the hottest zone, degrees C */
    bool has_battery;
    double battery_pct;       /* 0..100 */
    enum sp_battery_status battery_status;
    bool has_psi;
    double psi_some_avg10, psi_full_avg10; /* % of time stalled on memory, last 10 s */
    bool has_load;            /* needs two readings of /proc/stat */
    double load_other;        /* cores busy with other work (>= 0) */
    double load_self;         /* cores this process used over the same time */
    double cpu_self_s;        /* this process's CPU seconds so far (always known) */
    int n_cpus;               /* online CPUs */
};

struct sp_sensors;

/* Copies the strings.  SP_E_NOMEM only. */
sp_status sp_sensors_init(const struct sp_sensor_cfg *cfg, struct sp_sensors **out);
void sp_sensors_free(struct sp_sensors *s);

/* The reading as of now: the cached one when the last was taken less than
 * min_interval_s ago and force is false, else fresh from the files.  Never
 * fails. */
void sp_sensors_read(struct sp_sensors *s, bool force, struct sp_sensor_reading *out);
/* Files read so far (tests check the rate limit). */
uint64_t sp_sensors_n_reads(const struct sp_sensors *s);

/* Parsers, exposed for the tests: a battery file's text, /proc/stat's text
 * (busy and total jiffies of the "cpu" line), /proc/pressure/memory's text.
 * false when the text is not what they expect. */
bool sp_sensors_parse_battery(const char *text, double *pct, enum sp_battery_status *st);
bool sp_sensors_parse_stat(const char *text, uint64_t *busy, uint64_t *total);
bool sp_sensors_parse_psi(const char *text, double *some10, double *full10);

double sp_mono_s(void);

#endif /* SP_SCHED_SENSORS_H */
