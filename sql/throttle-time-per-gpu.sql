-- throttle-time-per-gpu: how long each GPU ran throttled, and why (NVML clock-event reasons).
--
-- From the raw gpu table: power_violation / thermal_violation (ns the driver held the
-- clocks down, stored as deltas) summed to seconds, and the share of samples with each
-- clocks-event reason bit set (0x4 SW power cap, 0x8 HW slowdown, 0x20 SW thermal,
-- 0x40 HW thermal, 0x80 HW power brake). Also the lowest enforced power limit relative
-- to the default and the mean SM clock relative to its maximum. Worst GPU first.
--
-- @param min_share float = 0.0  only GPUs throttled (any reason) in at least this share of samples
SELECT * FROM (
    SELECT
        host,
        gpu,
        count(*) AS samples,
        round(sum(coalesce(power_violation, 0)) / 1e9, 3) AS power_capped_s,
        round(sum(coalesce(thermal_violation, 0)) / 1e9, 3) AS thermal_capped_s,
        round(avg(CASE WHEN (clock_event_reasons & 4) > 0 THEN 1.0 ELSE 0.0 END), 4) AS sw_power_cap_share,
        round(avg(CASE WHEN (clock_event_reasons & 8) > 0 THEN 1.0 ELSE 0.0 END), 4) AS hw_slowdown_share,
        round(avg(CASE WHEN (clock_event_reasons & 32) > 0 THEN 1.0 ELSE 0.0 END), 4) AS sw_thermal_share,
        round(avg(CASE WHEN (clock_event_reasons & 64) > 0 THEN 1.0 ELSE 0.0 END), 4) AS hw_thermal_share,
        round(avg(CASE WHEN (clock_event_reasons & 128) > 0 THEN 1.0 ELSE 0.0 END), 4) AS hw_power_brake_share,
        round(avg(CASE WHEN (clock_event_reasons & 236) > 0 THEN 1.0 ELSE 0.0 END), 4) AS any_throttle_share,
        round(min(power_limit_w / power_limit_default_w), 3) AS min_power_limit_ratio,
        round(avg(sm_clock_mhz / sm_clock_max_mhz), 3) AS mean_sm_clock_ratio,
        round(max(temperature_c), 1) AS max_temperature_c
    FROM gpu
    GROUP BY host, gpu
) AS t
WHERE any_throttle_share >= :min_share
ORDER BY power_capped_s + thermal_capped_s DESC, any_throttle_share DESC, host, gpu
