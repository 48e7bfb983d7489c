set terminal pngcairo size 1000,600 noenhanced
set output 'bench/dflash2_runs/dpace_demo_acceptance.png'
set title 'fraction of cycles accepting at least k draft tokens (mean over seeds)'
set xlabel 'slot k'
set ylabel 'reached'
set xtics 1
set yrange [0:1]
set grid
set key top right
plot 'bench/dflash2_runs/acceptance_by_slot.tsv' using 1:2 with linespoints lc 1 dt 1 title 'dflash_teacher', 'bench/dflash2_runs/acceptance_by_slot.tsv' using 1:3 with linespoints lc 1 dt 2 title 'dflash_speculative', 'bench/dflash2_runs/acceptance_by_slot.tsv' using 1:4 with linespoints lc 2 dt 1 title 'dflash2_teacher', 'bench/dflash2_runs/acceptance_by_slot.tsv' using 1:5 with linespoints lc 2 dt 2 title 'dflash2_speculative'
