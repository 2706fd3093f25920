#!/usr/bin/perl
# cuda_emu_translate.pl IN.cu OUT.cpp: rewrites every kernel launch
# `kernel<<<config>>>(args);` of a .cu file (a template's too:
# `kernel<float><<<...`) into a call g++ can compile,
# `emu_launch(emu_bind(kernel, args), "kernel (IN.cu:LINE)", config);`,
# keeping every line where it was (cuda_emu.h says what emu_launch does).
# emu_bind takes the arguments' values at the launch, as CUDA does: a
# launch may be queued and run after the caller returned or changed them
# (PPRUN_STUB_ASYNC_US).
use strict;
use warnings;
my ($in, $out) = @ARGV;
die "usage: cuda_emu_translate.pl IN.cu OUT.cpp\n" unless defined $out;
open(my $fh, '<', $in) or die "cuda_emu_translate.pl: cannot read $in: $!\n";
local $/;
my $src = <$fh>;
close $fh;
my $launches = 0;
$src =~ s{(\w+)((?:<[\w\s,]*>)?)<<<(.*?)>>>\((.*?)\);}{
    my $line = 1 + (substr($src, 0, $-[0]) =~ tr/\n//);
    $launches++;
    my ($kernel, $tmpl, $config, $args) = ($1, $2, $3, $4);
    $args = $args =~ /\S/ ? ", $args" : "";
    "emu_launch(emu_bind($kernel$tmpl$args), \"$kernel ($in:$line)\", $config);"
}gse;
die "cuda_emu_translate.pl: no kernel launch found in $in\n" unless $launches;
open(my $oh, '>', $out) or die "cuda_emu_translate.pl: cannot write $out: $!\n";
print $oh "#line 1 \"$in\"\n", $src;
close $oh or die "cuda_emu_translate.pl: cannot write $out: $!\n";
